#!/usr/bin/env bash
# Build the gpulens container images with no daemon and no registry: a minimal Debian root
# filesystem from mmdebstrap, then buildah from scratch, written as OCI archives:
#   build/images/gpulens-exporter-<version>.oci.tar    NVML, Kubernetes API and PodResources clients
#   build/images/gpulens-dashboard-<version>.oci.tar   Streamlit dashboard and right-sizing advisor
#   build/images/gpulens-exporter-<version>-cuda12.oci.tar   (target exporter-cuda12 only) the
#     exporter plus CuPy for the bandwidth probes: tag <version>-cuda12
# The version is pyproject.toml's. Two builds of the same tree from empty storage give the same
# image digests (docs/deploy.md, "Images"); build/images/<name>-<version>.digest holds each one.
#
# Usage: scripts/image.sh [exporter|dashboard|exporter-cuda12|all]...   (default: all = exporter, dashboard)
# Needs (Debian): mmdebstrap buildah uidmap, and uv; runs as root (mmdebstrap --mode=root).
# Env: GPULENS_IMAGE_REGISTRY (default ghcr.io/gpulens): the names the archives carry;
#      GPULENS_DEBIAN_MIRROR / GPULENS_DEBIAN_SECURITY: Debian mirrors;
#      GPULENS_IMAGE_OUT: output folder (default build/images);
#      GPULENS_IMAGE_CACHE=0: rebuild the base root filesystem even if one with the same inputs
#      is cached under build/images/rootfs/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGETS=" ${*:-all} "
for target in $TARGETS; do
  case $target in exporter | dashboard | exporter-cuda12 | all) ;; *)
    echo "usage: $0 [exporter|dashboard|exporter-cuda12|all]..." >&2
    exit 2
    ;;
  esac
done
wants() { [[ $TARGETS == *" $1 "* ]]; }

if [ "$(id -u)" != 0 ]; then
  echo "scripts/image.sh: run as root (mmdebstrap --mode=root, buildah with vfs storage)" >&2
  exit 2
fi
for tool in mmdebstrap buildah uv python3 git; do
  command -v "$tool" >/dev/null || {
    echo "scripts/image.sh: $tool is missing (Debian: apt-get install mmdebstrap buildah uidmap; uv from PyPI)" >&2
    exit 2
  }
done

SUITE=bookworm # Python 3.11, the version the requirement locks are resolved for
MIRROR=${GPULENS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${GPULENS_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
REGISTRY=${GPULENS_IMAGE_REGISTRY:-ghcr.io/gpulens}
OUT=${GPULENS_IMAGE_OUT:-$ROOT/build/images}
export SOURCE_DATE_EPOCH=0 # every timestamp in the images; the digest then depends on content only
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

# buildah reads its settings from files in this repository only, never from /etc.
export CONTAINERS_CONF=$ROOT/deploy/image/containers.conf
export CONTAINERS_REGISTRIES_CONF=$ROOT/deploy/image/registries.conf
STORE=$(mktemp -d "${TMPDIR:-/tmp}/gpulens-image.XXXXXX") # empty storage for every build
trap 'buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs rm -a >/dev/null 2>&1 || true; rm -rf "$STORE"' EXIT
bah() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs "$@"; }
mkdir -p "$OUT/rootfs" "$OUT/uv-cache"
# The uv binary itself (not a pyenv or pipx shim): it runs inside the build containers.
UV_BIN=$(python3 -c 'import uv; print(uv.find_uv_bin())' 2>/dev/null || readlink -f "$(command -v uv)")
t0=$(date +%s)

# ---- 1. base root filesystem: Debian's python3 and the libraries it needs, nothing else ----------
sources=(
  "deb $MIRROR $SUITE main"
  "deb $MIRROR $SUITE-updates main"
  "deb $SECURITY $SUITE-security main"
)
mm_args=(
  --variant=essential --include=python3 --mode=root --format=tar
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr # merged /usr without the usrmerge package (perl)
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/i18n/*'
  --dpkgopt='path-exclude=/usr/share/zoneinfo/*' --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*'
  --customize-hook="python3 '$ROOT/deploy/image/trim_rootfs.py' \"\$1\" python3 base-files base-passwd dpkg >/dev/null"
  # What a container runtime mounts over or links (podman, the kubelet), present so it creates
  # nothing in /etc: a read-only container's root then stays exactly the image.
  --customize-hook='for f in hosts hostname resolv.conf; do : >"$1/etc/$f"; chmod 644 "$1/etc/$f"; done'
  --customize-hook='ln -sfn /proc/mounts "$1/etc/mtab"'
)
# The cache key: the mmdebstrap arguments, the trim script and the mirrors' current package
# indexes (InRelease), so a changed mirror or recipe builds a new root filesystem.
key=$(
  {
    printf '%s\n' "${mm_args[@]}" "${sources[@]}"
    cat deploy/image/trim_rootfs.py
    for s in "$MIRROR/dists/$SUITE" "$MIRROR/dists/$SUITE-updates" "$SECURITY/dists/$SUITE-security"; do
      python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=60).read())' "$s/InRelease"
    done
  } | sha256sum | cut -c1-16
)
rootfs=$OUT/rootfs/$SUITE-$key.tar
if [ "${GPULENS_IMAGE_CACHE:-1}" = 0 ] || [ ! -s "$rootfs" ]; then
  echo "+ mmdebstrap $SUITE -> ${rootfs#"$ROOT"/}"
  rm -f "$OUT"/rootfs/*.tar
  mmdebstrap -q "${mm_args[@]}" "$SUITE" "$rootfs.part" "${sources[@]}" >"$OUT/rootfs/mmdebstrap.log" 2>&1 ||
    { tail -40 "$OUT/rootfs/mmdebstrap.log" >&2; exit 1; }
  mv "$rootfs.part" "$rootfs"
else
  echo "+ base root filesystem cached: ${rootfs#"$ROOT"/}"
fi

# ---- 2. the gpulens wheel, from the tracked and untracked-but-not-ignored files of this tree ------
src=$STORE/src
mkdir -p "$src" "$STORE/wheels"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$src"
echo "+ uv build --wheel"
uv build -q --wheel --out-dir "$STORE/wheels" "$src"

# ---- 3. base image: the root filesystem as one layer ---------------------------------------------
c=$(bah from scratch)
bah add -q "$c" "$rootfs" /
bah commit -q --timestamp 0 --rm "$c" localhost/gpulens-base >/dev/null

# ---- 4. one image per component: a venv at /opt/<component> from the locked requirements ---------
build_image() { # name tag component lock entrypoint port env...
  local name=$1 tag=$2 comp=$3 lock=$4 entry=$5 port=$6
  shift 6
  local venv=/opt/$comp archive=$OUT/$name-$tag.oci.tar layout=$STORE/layout-$name-$tag
  echo "+ $name:$tag"
  c=$(bah from --pull-never localhost/gpulens-base)
  # Everything the build needs is mounted under /tmp/build and removed before the commit.
  local run=(bah run --isolation chroot
    -v "$UV_BIN:/tmp/build/uv:ro" -v "$src:/tmp/build/src:ro" -v "$STORE/wheels:/tmp/build/wheels:ro"
    -v "$OUT/uv-cache:/tmp/build/uv-cache" -v /etc/ssl/certs/ca-certificates.crt:/tmp/build/ca.crt:ro
    --env UV_CACHE_DIR=/tmp/build/uv-cache --env UV_LINK_MODE=copy --env UV_NO_CONFIG=1
    --env UV_PYTHON_DOWNLOADS=never --env SSL_CERT_FILE=/tmp/build/ca.crt --env UV_NATIVE_TLS=1
    --env SOURCE_DATE_EPOCH=0 --env PYTHONDONTWRITEBYTECODE=1 --env HOME=/tmp/build)
  # The recipe deploy/Dockerfile's build stage runs too (tests/test_image.py compares the results).
  "${run[@]}" --env UV=/tmp/build/uv "$c" -- /usr/bin/python3 /tmp/build/src/deploy/image/install_venv.py \
    "$venv" "/tmp/build/src/$lock" --no-index --find-links /tmp/build/wheels "gpulens==$VERSION"
  local mnt
  mnt=$(bah mount "$c")
  rm -rf "$mnt/tmp/build" # the mount points
  bah umount "$c" >/dev/null
  local envs=() e
  for e in "$@"; do envs+=(--env "$e"); done
  bah config --user 65534:65534 --workingdir / --port "$port/tcp" \
    --entrypoint "[\"$entry\"]" --cmd '' \
    --env "PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 --env HOME=/tmp "${envs[@]}" \
    --label "org.opencontainers.image.title=$name" --label "org.opencontainers.image.version=$VERSION" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label "org.opencontainers.image.source=https://github.com/gpulens/gpulens" \
    --created-by "scripts/image.sh" --history-comment "" "$c"
  rm -rf "$layout"
  bah commit -q --timestamp 0 --rm --format oci "$c" "oci:$layout:$REGISTRY/$name:$tag" >/dev/null
  # A tar with fixed order, owner and times: the archive's bytes, not only its digest, repeat.
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$archive.part" -C "$layout" .
  mv "$archive.part" "$archive"
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' \
    "$layout/index.json" >"$OUT/$name-$tag.digest"
  local manifest
  manifest=$layout/blobs/sha256/$(cut -d: -f2 "$OUT/$name-$tag.digest")
  echo "  ${archive#"$ROOT"/}  $(cat "$OUT/$name-$tag.digest")  $(python3 -c 'import json, sys
layers = json.load(open(sys.argv[1]))["layers"]
size = sum(layer["size"] for layer in layers) / 1e6
print(f"{size:.1f} MB uncompressed, {len(layers)} layers")' "$manifest")"
}

if wants all || wants exporter; then
  build_image gpulens-exporter "$VERSION" exporter deploy/image/requirements-exporter.txt gpulens-exporter 9445 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
fi
if wants all || wants dashboard; then
  build_image gpulens-dashboard "$VERSION" dashboard deploy/image/requirements-dashboard.txt gpulens-dashboard 8501 \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false
fi
if wants exporter-cuda12; then
  build_image gpulens-exporter "$VERSION-cuda12" exporter deploy/image/requirements-exporter-cuda12.txt \
    gpulens-exporter 9445 NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
fi
echo "+ built in $(($(date +%s) - t0)) s"
