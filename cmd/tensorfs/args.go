package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// usageError is a command line the command cannot run: a missing or extra
// argument. main prints it, then the command's usage, and exits 2 (the
// shell's convention for a misused command), where cobra's own count
// errors ("accepts 1 arg(s), received 0") name neither the argument nor
// the command's synopsis.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// positional is the Args validator of every command: between min and max
// arguments (max < 0: no upper bound). Its errors name what is missing from
// the command's Use line ("mount: missing MOUNTPOINT") and are usageErrors,
// so the usage follows them.
func positional(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		names := argNames(cmd.Use)
		switch {
		case len(args) < min:
			missing := names
			if len(args) < len(names) {
				missing = names[len(args):]
			}
			if len(missing) > min-len(args) {
				missing = missing[:min-len(args)]
			}
			return &usageError{fmt.Sprintf("%s: missing %s", cmd.Name(), strings.Join(missing, " and "))}
		case max >= 0 && len(args) > max:
			if max == 0 {
				return &usageError{fmt.Sprintf("%s takes no arguments (got %q)", cmd.Name(), args)}
			}
			return &usageError{fmt.Sprintf("%s: too many arguments: want %s, got %d (%q)", cmd.Name(), strings.Join(names, " "), len(args), args)}
		}
		return nil
	}
}

// argNames are the positional arguments of a Use line ("cp SRC DST":
// SRC, DST; "ls [-l] PATH": PATH; "nodes [MOUNTPOINT]": [MOUNTPOINT]):
// the words after the command's name, except flags.
func argNames(use string) []string {
	f := strings.Fields(use)
	var names []string
	for _, w := range f[min(1, len(f)):] {
		if w == "[flags]" || strings.HasPrefix(strings.Trim(w, "["), "-") {
			continue
		}
		names = append(names, w)
	}
	return names
}
