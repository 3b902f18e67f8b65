// Command virtx runs commands in disposable Linux sessions (`virtx run`), serves the
// Headless Console Protocol on stdio (`virtx serve`), and reports on the host.
// Installed as `virtx-uvm`, it acts as `virtx serve`, which is where the upstream virtx
// clients look for their server.
package main

import (
	"os"

	"virtx.dev/virtx/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args))
}
