package main

import "github.com/spf13/cobra"

// Placeholders until import/export land (same session).
func newImportCmd() *cobra.Command { return &cobra.Command{Use: "import", Hidden: true} }
func newExportCmd() *cobra.Command { return &cobra.Command{Use: "export", Hidden: true} }
