package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// configMountpoint is the config file's key for the mount's argument.
const configMountpoint = "mountpoint"

// applyConfig sets the flags of fs from the YAML file path (none when path
// is ""), each key naming a flag without its dashes, and returns the
// mountpoint: the command line's argument, else the file's "mountpoint".
// Flags given on the command line win: a key only sets a flag that was not
// changed before the file was read. notes are warnings to log once the
// log is set up (none today: every key is a flag or an error).
//
// Generic on purpose: every flag of the command, today's and tomorrow's,
// can be set from the file without a table to keep in step with the
// flags. A list sets a repeatable flag once per item (--peer), or joins
// with commas for a comma-separated one (--etcd).
// Errors: an unreadable file, bad YAML, an unknown key (named), a value
// the flag refuses, no mountpoint at all.
func applyConfig(fs *pflag.FlagSet, path string, args []string) (mnt string, notes []string, err error) {
	if len(args) > 0 {
		mnt = args[0]
	}
	if path == "" {
		if mnt == "" {
			return "", nil, &usageError{"mount: missing MOUNTPOINT"}
		}
		return mnt, nil, nil
	}
	doc, err := readConfig(path)
	if err != nil {
		return "", nil, err
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	// Sorted: the first error named is the same from run to run.
	sort.Strings(keys)
	for _, k := range keys {
		n := doc[k]
		vals, err := configValues(&n)
		if err != nil {
			return "", nil, fmt.Errorf("--config %s: key %q: %v", path, k, err)
		}
		if k == configMountpoint {
			if len(vals) != 1 {
				return "", nil, fmt.Errorf("--config %s: key %q: want one path", path, k)
			}
			if mnt == "" {
				mnt = vals[0]
			}
			continue
		}
		f := fs.Lookup(k)
		if f == nil || k == "config" || k == "help" {
			return "", nil, fmt.Errorf("--config %s: unknown key %q (keys are the flags of tensorfs mount without dashes, and mountpoint)", path, k)
		}
		if f.Changed {
			continue // the command line wins
		}
		if err := setFlag(fs, f, vals); err != nil {
			return "", nil, fmt.Errorf("--config %s: key %q: %v", path, k, err)
		}
	}
	if mnt == "" {
		return "", nil, fmt.Errorf("no MOUNTPOINT: neither an argument nor mountpoint in %s", path)
	}
	return mnt, notes, nil
}

// readConfig reads the YAML file path: one mapping of keys to scalars or
// lists of scalars (yaml.v3 refuses a key given twice). An empty file is
// an empty mapping.
func readConfig(path string) (map[string]yaml.Node, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var doc map[string]yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--config %s: %v", path, err)
	}
	return doc, nil
}

// configMountpointOf is the mountpoint a config file names, for tensorfs
// unmount --config (the service's ExecStop): the same file as the mount's,
// so that the mountpoint is written once. Its other keys are not checked
// here: the mount did when it started.
func configMountpointOf(path string) (string, error) {
	doc, err := readConfig(path)
	if err != nil {
		return "", err
	}
	n, ok := doc[configMountpoint]
	if !ok || n.Kind != yaml.ScalarNode || n.Value == "" {
		return "", fmt.Errorf("--config %s: no mountpoint", path)
	}
	return n.Value, nil
}

// configValues gives a key's value as strings: one for a scalar, one per
// item for a list of scalars. Mappings and nested lists are refused: no
// flag takes them.
func configValues(n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		vals := make([]string, len(n.Content))
		for i, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("item %d is not a scalar", i+1)
			}
			vals[i] = c.Value
		}
		return vals, nil
	}
	return nil, errors.New("want a scalar or a list of scalars")
}

// setFlag sets f from a config value: a repeatable flag (stringArray,
// stringSlice, ...) gets the list as its whole value, any other one value
// (a list joined with commas: --etcd takes a comma-separated list).
// Either way the flag reads as changed, as one given on the command line
// does (checks such as --advertise needing --etcd see it).
func setFlag(fs *pflag.FlagSet, f *pflag.Flag, vals []string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		if err := sv.Replace(vals); err != nil {
			return err
		}
		f.Changed = true
		return nil
	}
	return fs.Set(f.Name, strings.Join(vals, ","))
}
