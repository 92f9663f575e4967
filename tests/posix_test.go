package tests

import (
	"os"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"github.com/stretchr/testify/require"
)

// TestPosix runs go-fuse's posixtest cases that apply to a flat tensor
// filesystem against a real mount. Not run, and why:
//   - SymlinkReadlink, SetattrSymlink, OpenSymlinkRace: no symlinks (EPERM).
//   - Link, LinkUnlinkRename: no hard links (EPERM).
//   - FcntlFlockSetLk, FcntlFlockLocksFile: no byte-range locks.
//   - LseekHoleSeeksToEOF, LseekEnxioCheck: no holes; tensors are dense.
//   - RenameOpenDir, ReadDirConsistency, OpenAt, FileLarge, XAttrLarge: not in
//     the list; XAttrLarge and FileLarge run below as extras.
func TestPosix(t *testing.T) {
	d := startDaemon(t)
	cases := map[string]func(*testing.T, string){
		"FileBasic":                  posixtest.FileBasic,
		"TruncateFile":               posixtest.TruncateFile,
		"TruncateNoFile":             posixtest.TruncateNoFile,
		"FstatDeleted":               posixtest.FstatDeleted,
		"NlinkZero":                  posixtest.NlinkZero,
		"MkdirRmdir":                 posixtest.MkdirRmdir,
		"ReadDirBasic":               posixtest.ReadDirBasic,
		"RenameOverwriteDestExist":   posixtest.RenameOverwriteDestExist,
		"RenameOverwriteDestNoExist": posixtest.RenameOverwriteDestNoExist,
		"AppendWrite":                posixtest.AppendWrite,
		"XAttr":                      posixtest.XAttr,
		"Fallocate":                  posixtest.Fallocate,
		"ParallelFileOpen":           posixtest.ParallelFileOpen,
		"FdLeak":                     posixtest.FdLeak,
		"DirectIO":                   posixtest.DirectIO,
		"FileLarge":                  posixtest.FileLarge,
		"XAttrLarge":                 posixtest.XAttrLarge,
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			dir := d.path(name)
			require.NoError(t, os.Mkdir(dir, 0o755))
			fn(t, dir)
			require.NoError(t, os.RemoveAll(dir))
		})
	}
	d.requireClean()
}
