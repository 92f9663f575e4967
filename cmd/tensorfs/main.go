// Command tensorfs mounts and drives a tensor filesystem: GPU or host memory
// exposed as files whose lifetime is their memory registration.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tensorfs:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "tensorfs",
		Short:         "A filesystem of tensors: files are device memory, registered for transfer while they exist",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newMountCmd(), newUnmountCmd(), newImportCmd(), newExportCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, args []string) { fmt.Println("tensorfs", version) },
	})
	root.AddCommand(newCpCmd(), newNodesCmd())
	return root
}
