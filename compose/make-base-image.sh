#!/usr/bin/env bash
# Make a local base image for the node image where no registry can be reached:
# debootstrap a minimal Debian root with python3, tar it, `docker import` it.
#
#   compose/make-base-image.sh [--tag TAG] [--suite SUITE] [--rebuild]
#
# The node image only needs CPython >= 3.11 as `python3` with its standard
# library (venv included: `python3 -m venv --without-pip` needs no ensurepip,
# and pip itself comes in as a wheel), so the root is debootstrap's `minbase`
# plus `python3`. Debian bookworm ships CPython 3.11.
#
# Reuse, cheapest first: the image already exists -> done (unless --rebuild);
# the root tarball is in the cache -> `docker import` it; otherwise debootstrap
# (a few minutes, once). The tarball lives in ${DLAB_CACHE_DIR:-$XDG_CACHE_HOME/
# durability-lab} so a removed image comes back in seconds.
#
# The Debian mirror is the one this host's apt uses (read from
# /etc/apt/sources.list and sources.list.d at run time); set DLAB_DEBIAN_MIRROR
# to override it (needed on a non-Debian host). debootstrap and the Debian
# archive keyring are installed with apt-get when missing. Needs root (debootstrap
# creates device nodes and chroots).
#
# Exit codes: 0 image present or made; 2 bad usage; 3 no Docker engine answers;
# 4 a prerequisite (root, apt-get, mirror) is missing; other: the failing step.
set -euo pipefail

TAG="durability-lab/base:bookworm"
SUITE="bookworm"
REBUILD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG="$2"; shift 2 ;;
        --suite) SUITE="$2"; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "make-base-image: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done

log() { echo "make-base-image: $*" >&2; }
die() { local code="$1"; shift; log "error: $*"; exit "$code"; }

command -v docker >/dev/null || die 3 "the docker CLI is not installed"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die 3 "no Docker engine answers (is dockerd running, and may this user use it?)"

CACHE="${DLAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/durability-lab}"
mkdir -p "$CACHE"
# One builder at a time per cache (tests and the CLI may race for it).
exec 9>"$CACHE/base-image.lock"
flock 9

image_present() { docker image inspect "$TAG" >/dev/null 2>&1; }

if [ "$REBUILD" -eq 0 ] && image_present; then
    log "$TAG is present; nothing to do (--rebuild makes it again)"
    exit 0
fi

ARCH="$(dpkg --print-architecture 2>/dev/null || true)"
if [ -z "$ARCH" ]; then
    case "$(uname -m)" in
        x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;;
        *) die 4 "unknown architecture $(uname -m)" ;;
    esac
fi
TARBALL="$CACHE/base-$SUITE-$ARCH.tar"

import_tarball() {
    log "importing $TARBALL as $TAG"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --change "LABEL org.opencontainers.image.title=durability-lab-base" \
        --change "LABEL durability-lab.base.suite=$SUITE" \
        --message "debootstrap --variant=minbase --include=python3 $SUITE" \
        "$TARBALL" "$TAG" >/dev/null
    docker run --rm --network none "$TAG" python3 -c \
        'import sys, venv; assert sys.version_info >= (3, 11), sys.version' \
        || die 1 "$TAG has no CPython >= 3.11 (suite $SUITE); use bookworm or newer"
    log "made $TAG ($(docker run --rm --network none "$TAG" python3 -V))"
}

if [ "$REBUILD" -eq 0 ] && [ -s "$TARBALL" ]; then
    import_tarball
    exit 0
fi

# --- debootstrap a fresh root -------------------------------------------------
[ "$(id -u)" -eq 0 ] || die 4 "debootstrap needs root; run this script as root (sudo)"

if ! command -v debootstrap >/dev/null \
        || [ ! -s /usr/share/keyrings/debian-archive-keyring.gpg ]; then
    command -v apt-get >/dev/null \
        || die 4 "debootstrap is missing and there is no apt-get to install it"
    log "debootstrap or the Debian archive keyring is missing: installing them with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        debootstrap debian-archive-keyring >/dev/null
fi

# The mirror apt already uses: the first `deb` source (one-line or deb822
# format) that serves this host's own Debian release, not its -security or
# -updates suites. Its URI serves every Debian suite, so it serves $SUITE too.
detect_mirror() {
    local codename f
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    [ -n "$codename" ] || return 0
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        case "$f" in
            *.sources) awk -v want="$codename" '
                function check(   n, s, k) {
                    if (types ~ /(^|[ \t])deb([ \t]|$)/ && uris != "") {
                        n = split(suites, s, /[ \t]+/)
                        for (k = 2; k <= n; k++) if (s[k] == want) { print uris; exit }
                    }
                    types = ""; uris = ""; suites = ""
                }
                /^[ \t]*#/ { next }
                /^[ \t]*$/ { check(); next }
                $1 == "Types:" { types = $0 }
                $1 == "URIs:" { uris = $2 }
                $1 == "Suites:" { suites = $0 }
                END { check() }' "$f" ;;
            *) awk -v want="$codename" '
                $1 == "deb" {
                    i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == want) { print $i; exit }
                }' "$f" ;;
        esac
    done | head -n 1 || true
}
MIRROR="${DLAB_DEBIAN_MIRROR:-$(detect_mirror)}"
[ -n "$MIRROR" ] || die 4 "found no Debian mirror in this host's apt sources; \
set DLAB_DEBIAN_MIRROR to a Debian archive URL that serves $SUITE"

ROOT="$(mktemp -d "$CACHE/root.XXXXXX")"
cleanup() { rm -rf --one-file-system "$ROOT" "$TARBALL.partial"; }
trap cleanup EXIT

log "debootstrap $SUITE ($ARCH, minbase + python3) from the host's apt mirror; takes a few minutes once"
started=$SECONDS
debootstrap --variant=minbase --include=python3 --arch="$ARCH" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$CACHE/debootstrap.log" >&2; die 1 "debootstrap failed (log: $CACHE/debootstrap.log)"; }
log "debootstrap took $((SECONDS - started)) s"

# What a container never needs: package caches and indexes, docs, man pages.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/cache/apt/*.bin \
    "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
    "$ROOT"/usr/share/info/* "$ROOT"/var/log/*.log "$ROOT"/var/log/apt/*
# No mirror address stays in the image; the node image never runs apt.
: >"$ROOT/etc/apt/sources.list"

# /dev, /proc and /sys are provided by the engine at run time.
tar --numeric-owner --xattrs -C "$ROOT" \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -cf "$TARBALL.partial" .
mv "$TARBALL.partial" "$TARBALL"
log "root tarball: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
import_tarball
