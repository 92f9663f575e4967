package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...", and
// then wins over the module version the build recorded (a release script
// knows the tag better than a build from a source tree, which says
// "(devel)").
var version = ""

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version: the module version, VCS revision and time of the build",
		Long: `Print the version of this binary, from what the Go toolchain recorded in it
(runtime/debug.ReadBuildInfo): the module version (or the one set with
-ldflags "-X main.version=..."), the VCS revision and commit time, "modified"
when the tree had uncommitted changes, and the Go version.`,
		Args: positional(0, 0),
		Run: func(cmd *cobra.Command, args []string) {
			bi, ok := debug.ReadBuildInfo()
			if !ok {
				bi = nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), versionString(version, bi))
		},
	}
}

// versionString is version's line: "tensorfs VERSION (REVISION, TIME,
// modified) GOVERSION", each part only when known. set is -X main.version
// ("" when not set); bi the build's info, nil when the binary has none.
// The revision is shortened to 12 digits, as git and go's pseudo-versions
// do: enough to find the commit, short enough to read.
func versionString(set string, bi *debug.BuildInfo) string {
	v := set
	if v == "" && bi != nil {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	var vcs []string
	goVersion := ""
	if bi != nil {
		goVersion = bi.GoVersion
		get := func(key string) string {
			for _, s := range bi.Settings {
				if s.Key == key {
					return s.Value
				}
			}
			return ""
		}
		if rev := get("vcs.revision"); rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			vcs = append(vcs, "revision "+rev)
		}
		if t := get("vcs.time"); t != "" {
			vcs = append(vcs, t)
		}
		if get("vcs.modified") == "true" {
			vcs = append(vcs, "modified")
		}
	}
	line := "tensorfs " + v
	if len(vcs) > 0 {
		line += " (" + strings.Join(vcs, ", ") + ")"
	}
	if goVersion != "" {
		line += " " + goVersion
	}
	return line
}
