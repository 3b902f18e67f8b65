#!/usr/bin/env bash
# bench/peers.sh: the sandbox backend against its peers on this machine, in one run.
#
# Installs what is missing from Debian (bubblewrap, runc, podman, busybox-static), builds
# virtx with CGO_ENABLED=0 and bench/virtxbench, then measures medians of:
#   bwrap running `true` (--ro-bind /usr, fresh namespaces), `runc run` of a minimal
#   busybox bundle, `podman run --rm` of an image imported from the same busybox rootfs
#   (vfs storage, cgroupfs manager, file events logger, no registry), and ours: a cold
#   session (spawn `virtx serve --backend sandbox` → init → first exec answered), a warm
#   exec against a bare fork+exec, and the RSS of 100 concurrent idle sessions.
# It prints a Markdown table with the ratios the sandbox issue sets as goals.
#
# Usage: sudo bench/peers.sh [--write]     (--write: also bench/RESULTS-sandbox.md)
# Environment: N (runs per measurement, default 50), IDLE (idle sessions, default 100).
# Everything it makes lives in one temporary directory, removed at exit; the host's own
# podman storage and configuration are not used.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
N=${N:-50}
IDLE=${IDLE:-100}
write=false
[[ ${1:-} == --write ]] && write=true

if [[ $(id -u) != 0 ]]; then
	echo "peers.sh: run as root (runc and podman are measured as root, and missing peers are installed with apt-get)" >&2
	exit 1
fi

# --- peers, from Debian ---
missing=()
for pair in bwrap:bubblewrap runc:runc podman:podman busybox:busybox-static; do
	command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
if ((${#missing[@]})); then
	echo "installing from Debian: ${missing[*]}" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
fi

work=$(mktemp -d /tmp/virtx-bench.XXXXXX)
# podman (cgroupfs) leaves a libpod_parent cgroup in each hierarchy: removed at exit when
# this run made it.
libpod_before=$(ls -d /sys/fs/cgroup/libpod_parent /sys/fs/cgroup/*/libpod_parent 2>/dev/null || true)
cleanup() {
	for d in /sys/fs/cgroup/libpod_parent /sys/fs/cgroup/*/libpod_parent; do
		[[ -d $d ]] && ! grep -qxF "$d" <<<"$libpod_before" && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	if [[ -f $work/containers.conf ]]; then
		CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf \
			podman rmi -af >/dev/null 2>&1 || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# --- a busybox rootfs: /bin/busybox and its applets as links ---
rootfs=$work/bundle/rootfs
mkdir -p "$rootfs"/{bin,proc,dev,sys,tmp,etc}
cp /bin/busybox "$rootfs/bin/busybox"
for applet in sh true echo ls cat; do ln -s busybox "$rootfs/bin/$applet"; done

# --- runc: the default spec, running /bin/true without a terminal ---
(cd "$work/bundle" && runc spec)
sed -i -e 's/"terminal": true/"terminal": false/' -e 's/^\(\s*\)"sh"$/\1"\/bin\/true"/' "$work/bundle/config.json"
grep -q '"/bin/true"' "$work/bundle/config.json" || { echo "peers.sh: could not edit runc's config.json" >&2; exit 1; }

# --- podman: configured for this host, storage and state in $work, image from the rootfs ---
cat >"$work/storage.conf" <<EOF
[storage]
driver = "vfs"
runroot = "$work/podman/run"
graphroot = "$work/podman/root"
EOF
# This host: crun refuses a hybrid cgroup layout, so runc; podman's default rlimits
# (nofile, nproc at 1048576/4194304) are above what this container may set, so lower ones.
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/podman/events.log"
tmp_dir = "$work/podman/tmp"
EOF
export CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf
podman_image=""
podman_err=""
if out=$(tar -C "$rootfs" -c . | podman import - virtxbench-busybox 2>&1); then
	podman_image=localhost/virtxbench-busybox
	if ! out=$(podman run --rm --network=none "$podman_image" /bin/true 2>&1); then
		podman_err=$(echo "$out" | tail -1)
		podman_image=""
	fi
else
	podman_err=$(echo "$out" | tail -1)
fi

# --- ours ---
echo "building virtx (CGO_ENABLED=0) and bench/virtxbench" >&2
CGO_ENABLED=0 go build -C "$repo" -o "$work/virtx" ./cmd/virtx
CGO_ENABLED=0 go build -C "$repo" -o "$work/virtxbench" ./bench/virtxbench
export VIRTX_HOME=$work/virtx-home

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
table=$("$work/virtxbench" -virtx "$work/virtx" -n "$N" -idle "$IDLE" \
	-runc-bundle "$work/bundle" -podman-image "$podman_image")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
report=$(
	echo "# Sandbox benchmarks against peers"
	echo
	echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') by bench/peers.sh (N=$N runs per measurement, medians)."
	echo
	echo "Machine: $cpu, $(nproc) CPUs, $mem, kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME");" \
		"cgroup $(stat -fc %T /sys/fs/cgroup/ | sed 's/tmpfs/v1 (hybrid)/;s/cgroup2fs/v2/');" \
		"bwrap $(bwrap --version | cut -d' ' -f2), runc $(runc --version | head -1 | cut -d' ' -f3), podman $(podman --version | cut -d' ' -f3), $(go version | cut -d' ' -f3)."
	echo "Load average before: $load_before; after: $load_after (the machine is shared: medians, not means)."
	if [[ -n $podman_err ]]; then
		echo
		echo "podman could not run here: \`$podman_err\`"
	fi
	echo
	echo "$table"
)
echo "$report"
if $write; then
	echo "$report" >"$repo/bench/RESULTS-sandbox.md"
	echo "wrote bench/RESULTS-sandbox.md" >&2
fi
