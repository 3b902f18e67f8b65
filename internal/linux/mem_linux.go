package linux

import (
	"bufio"
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// DropExecutablePages hands back this process's pages of its own executable's read-only
// mappings (code and read-only data): madvise MADV_DONTNEED unmaps them, and
// MADV_RANDOM makes a later fault map the one page it needs rather than the kernel's
// fault-around window (64 KiB by default). The pages stay in the page cache, shared with
// every process that runs the binary, so nothing is read from disk again while memory
// is not short: what the process touches next is mapped again on the fault, a
// microsecond or so a page. Writable mappings (data, bss) are never touched:
// MADV_DONTNEED would throw their changes away. It returns the bytes of the mappings it
// advised.
func DropExecutablePages() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, wrap("readlink", "/proc/self/exe", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, wrap("read", "/proc/self/maps", err)
	}
	var total int64
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := bytes.Fields(sc.Bytes())
		if len(f) != 6 || string(f[5]) != exe || len(f[1]) < 2 || f[1][1] != '-' {
			continue
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			continue
		}
		// By address, not a []byte over memory Go does not own. MADV_RANDOM first: the code
		// that runs between the two calls maps again what it touches, a page at a time.
		for _, advice := range []uintptr{unix.MADV_RANDOM, unix.MADV_DONTNEED} {
			if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), advice); e != 0 {
				return total, wrap("madvise", exe, e)
			}
		}
		total += int64(end - start)
	}
	return total, nil
}
