package main

import (
	"os/exec"
	"strings"
)

func runFusermount(dir string) (string, error) {
	out, err := exec.Command("fusermount3", "-u", dir).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
