//go:build !linux

package guest

import (
	"errors"
	"runtime"
)

// Main is /init of a Linux VM guest; elsewhere there is nothing to do.
func Main() error {
	return errors.New("guest init is unsupported on " + runtime.GOOS + ": it runs as /init of a Linux VM guest")
}
