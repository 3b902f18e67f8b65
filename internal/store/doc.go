// Package store is virtx's image store: an OCI image layout in the cache dir, the
// registry pulls that fill it, the builds that extend it (a protocol.Recipe or a
// one-stage Dockerfile), imports and exports, and Resolve, which turns an init's
// ImageSource into the read-only layer directories a session stacks as overlay lowers.
//
// # On disk
//
// Everything lives under <cache>/images (the cache dir is console.CacheDir()):
//
//	oci-layout                  {"imageLayoutVersion":"1.0.0"}: the directory is an OCI layout
//	index.json                  the images: one descriptor per (manifest, ref); refs are in the
//	                            org.opencontainers.image.ref.name annotation, canonical
//	                            ("docker.io/library/alpine:3.20"); an image with no ref has one
//	                            descriptor without it; a built image lists the images after each
//	                            of its steps in dev.virtx.build.chain, which keeps them alive
//	blobs/sha256/<hex>          manifests, configs and layers, named by their digest
//	layers/<diff_id hex>/       each layer unpacked once, keyed by the digest of its
//	                            uncompressed tar and shared by every image that has it: an
//	                            overlayfs lower (OCI whiteouts are 0/0 character devices, opaque
//	                            directories carry trusted.overlay.opaque=y; the conversion is
//	                            internal/executor.ApplyLayer's)
//	buildcache/<key hex>        a RUN step's result: the manifest digest of the image after the
//	                            step, keyed by sha256(image-so-far digest, step)
//	derived/<manifest hex>/<n>  files a backend makes from a whole image (Store.Derived): the vm
//	                            backend's vm-<format>.erofs, the image's layers flattened into one
//	                            read-only filesystem for its guests; made once, published by
//	                            rename, deleted by the collector with the image
//	locks/                      flock(2) files: gc, index, blob-<hex>, layer-<diff_id hex>,
//	                            derived-<manifest hex>-<n>
//	tmp/                        files and directories being written
//
// # Locking
//
// Several processes (two servers, a server and `virtx image pull`) share one store; all
// coordination is flock(2), which the kernel releases when a holder dies.
//
//   - locks/gc: every operation that writes blobs or layers or reads the index to use it
//     holds it shared; garbage collection holds it exclusive, so nothing is collected
//     while a pull or a build has written blobs the index does not name yet.
//   - locks/index: held exclusive around each read-modify-write of index.json.
//   - locks/blob-<hex>, locks/layer-<hex>, locks/derived-<hex>-<n>: exclusive while that
//     blob is fetched, that layer unpacked or that derived file made, so two pulls of one
//     image fetch each blob once (and two servers make one erofs once); the second waits
//     and finds it there. A session's Image holds its layers' locks shared until Release,
//     and the collector skips a layer whose lock it cannot take exclusive, so a layer is
//     never deleted from under a running session, even after its image is removed.
//
// Locks are taken in one order — gc, then a blob or layer lock, then index — and flock
// is per open file, so one process taking gc exclusive while it holds gc shared elsewhere
// would wait on itself: GC (and Remove) must not be called while the same process holds
// the gc lock, which only this package's own operations take, each for its own duration.
//
// # Crash safety
//
// Nothing becomes visible half-written: a blob is written to tmp/, its digest checked,
// then renamed into blobs/; a layer is unpacked into tmp/ and the directory renamed into
// layers/ once whole; index.json is replaced by rename, and only after every blob its new
// entries need is in place. A process killed at any point (SIGKILL included) leaves at
// most files in tmp/, which the next writer of the same digest deletes before starting
// and the collector deletes wholesale; the next pull or build redoes the work. Writes
// are not fsynced: a power loss can lose recent entries (the index is renamed last, so
// an entry whose blobs were lost is the failure to expect; `virtx image rm` and a new
// pull repair it).
//
// # Pulling, and registry mirrors
//
// A ref the store holds is used as it is: Resolve never asks a registry about an image it
// has (`virtx image pull` is how a tag is refreshed). A pull picks this host's platform
// from a multi-platform index, checks every blob's digest as it is written, takes
// credentials from ~/.docker/config.json (authn.DefaultKeychain) and otherwise goes
// anonymously.
//
// Mirrors let a site without access to a registry — Docker Hub, typically — pull its
// images from one of its own. They are REGISTRY=URL pairs, from $VIRTX_REGISTRY_MIRRORS
// (comma- or space-separated) and then from <cache>/mirrors.conf (one or more per line,
// `#` comments), tried in that order before the registry itself:
//
//	VIRTX_REGISTRY_MIRRORS="docker.io=http://127.0.0.1:5000,ghcr.io=https://mirror.example/ghcr"
//
// The mirror serves the same repository paths (alpine:3.20 is library/alpine:3.20 there);
// a URL path is put in front of them (http://10.0.0.5:5000/hub serves
// hub/library/alpine). http:// mirrors are spoken to in plain HTTP. The image is recorded
// under the name asked for, not the mirror's.
//
// # The seam for sessions
//
// A backend calls Resolve(ctx, src, runner) at boot: it pulls, builds or looks up the
// image and returns an *Image with the layer directories (top first), the config's env
// and working directory, and leases on the layers that Release drops. A build's RUN steps
// need a session on the image so far; the backend supplies that as a StepRunner.
//
// # Hand-rolled parts
//
// go-containerregistry does the registry protocol, the manifest and config types and the
// docker-archive and OCI-layout readers. Written here: the locking and the index (its
// layout writer is not safe across processes), the layer-from-a-file type (its tarball
// layers recompress), registry mirrors (it has none), and the tar of a COPY source.
package store
