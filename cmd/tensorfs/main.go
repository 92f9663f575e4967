// Command tensorfs mounts and drives a tensor filesystem: GPU or host memory
// exposed as files whose lifetime is their memory registration.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(newRootCmd(), os.Stderr))
}

// run executes root and returns the exit status: 0, 1 for a failure (one
// line, "tensorfs: ..."), 2 for a command line that cannot run (a missing
// or extra argument: the line, then the command's usage, so the user sees
// what it takes without a second call with --help).
func run(root *cobra.Command, stderr io.Writer) int {
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "tensorfs:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprint(stderr, "\n"+cmd.UsageString())
		return 2
	}
	return 1
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "tensorfs",
		Short: "A filesystem of tensors: files are device memory, registered for transfer while they exist",
		// Usage is printed by run, for argument errors only: a failure
		// while running (a bad flag value, a refused mount) is one line,
		// which the usage would bury.
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newMountCmd(), newUnmountCmd(), newImportCmd(), newExportCmd(), newVersionCmd())
	root.AddCommand(newCpCmd(), newBenchCmd(), newNodesCmd(), newStatusCmd(), newLsCmd(), newStatCmd(), newWaitCmd())
	return root
}
