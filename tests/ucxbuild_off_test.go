//go:build !ucx

package tests

// ucxBuild: this test binary and the tensorfs it builds have UCX (build tag
// ucx). Here they do not.
const ucxBuild = false
