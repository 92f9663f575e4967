package fs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// isMountpoint reports whether dir is the mountpoint of a FUSE mount named
// tensorfs in /proc/self/mounts.
func isMountpoint(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && unescapeMount(fields[1]) == abs && strings.HasPrefix(fields[2], "fuse") && strings.Contains(fields[0], "tensorfs") {
			return true
		}
	}
	return false
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func runQuiet(name string, args ...string) error {
	return exec.Command(name, args...).Run()
}
