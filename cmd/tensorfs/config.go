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
// changed before the file was read.
//
// Generic on purpose: every flag of the command, today's and tomorrow's,
// can be set from the file without a table to keep in step with the
// flags. A list sets a repeatable flag once per item (--peer), or joins
// with commas for a comma-separated one (--etcd).
// Errors: an unreadable file, bad YAML, an unknown key (named), a value
// the flag refuses, no mountpoint at all.
func applyConfig(fs *pflag.FlagSet, path string, args []string) (mnt string, err error) {
	if len(args) > 0 {
		mnt = args[0]
	}
	if path == "" {
		if mnt == "" {
			return "", &usageError{"mount: missing MOUNTPOINT"}
		}
		return mnt, nil
	}
	doc, err := readConfig(path)
	if err != nil {
		return "", err
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	// Sorted: the first error named is the same from run to run.
	sort.Strings(keys)
	for _, k := range keys {
		var f *pflag.Flag
		if k != configMountpoint {
			if f = fs.Lookup(k); f == nil || k == "config" || k == "help" {
				return "", fmt.Errorf("--config %s: unknown key %q (keys are the flags of tensorfs mount without dashes, and mountpoint)", path, k)
			}
		}
		n := doc[k]
		vals, err := configValues(&n)
		if err != nil {
			return "", fmt.Errorf("--config %s: key %q: %v", path, k, err)
		}
		if k == configMountpoint {
			if len(vals) != 1 {
				return "", fmt.Errorf("--config %s: key %q: want one path", path, k)
			}
			if mnt == "" {
				mnt = vals[0]
			}
			continue
		}
		if f.Changed {
			continue // the command line wins
		}
		if err := setFlag(fs, f, vals); err != nil {
			return "", fmt.Errorf("--config %s: key %q: %v", path, k, err)
		}
	}
	if mnt == "" {
		return "", fmt.Errorf("no MOUNTPOINT: neither an argument nor mountpoint in %s", path)
	}
	return mnt, nil
}

// maxConfig is the largest config file read, in bytes: a node's settings
// are a few hundred; --config /dev/zero must not take the memory.
const maxConfig = 1 << 20

// readConfig reads the YAML file path: one document, one mapping of keys
// to scalars or lists of scalars (yaml.v3 refuses a key given twice). An
// empty file is an empty mapping. Errors: not a regular file (a FIFO would
// block the start, a device would never end), over maxConfig bytes, a
// second document (its keys would be ignored), YAML's.
func readConfig(path string) (map[string]yaml.Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("--config %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return nil, fmt.Errorf("--config %s: %v", path, err)
	}
	if len(b) > maxConfig {
		return nil, fmt.Errorf("--config %s: larger than %d bytes", path, maxConfig)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc map[string]yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--config %s: %v", path, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--config %s: more than one YAML document (one mapping of settings, no ---)", path)
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
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias // an anchor's value, as if written here
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, errors.New("no value (null): give one, or leave the key out")
		}
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		vals := make([]string, len(n.Content))
		for i, c := range n.Content {
			if c.Kind == yaml.AliasNode && c.Alias != nil {
				c = c.Alias
			}
			if c.Kind != yaml.ScalarNode || c.Tag == "!!null" {
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
