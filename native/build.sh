#!/usr/bin/env bash
# Build what FUSE passthrough needs on Debian 12, into a private prefix (see native/DESIGN.md):
#
#   native/build.sh libfuse BUILD_DIR   libfuse >= 3.17 from Debian trixie's fuse3 source
#                                       package (apt checks its signature and hashes) into
#                                       BUILD_DIR/libfuse
#   native/build.sh pyfuse3 BUILD_DIR   pyfuse3 3.5.0 from its hash-checked sdist, with
#                                       native/pyfuse3-passthrough.patch, linked against
#                                       BUILD_DIR/libfuse (rpath): a wheel in BUILD_DIR/wheels
#   native/build.sh fetch SOURCES_DIR   only fetch what the two steps build from (the fuse3
#                                       source package, the pyfuse3 sdist, the wheels of
#                                       build-requirements.txt), each checked as above, and
#                                       write SOURCES_DIR/SHA256SUMS: the hashes apt's signed
#                                       index and this script pin for each file
#
# With STRATA_NATIVE_SOURCES=SOURCES_DIR the libfuse and pyfuse3 steps use no network:
# they check SOURCES_DIR against its SHA256SUMS (the pyfuse3 sdist against PYFUSE3_SHA256
# below, the wheels against build-requirements.txt too) and build from it. The container
# image's native stage builds this way (deploy/image.py fetches on the host).
#
# The system's apt configuration is untouched: the source list, package lists and cache
# live under BUILD_DIR/apt. Every failure stops the build with a message (set -e).
set -euo pipefail

PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24  # = requirements-dev.lock
LIBFUSE_MIN=3.17
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SUITE=${STRATA_LIBFUSE_SUITE:-trixie}

die() { echo "native/build.sh: error: $*" >&2; exit 1; }

SOURCES=${STRATA_NATIVE_SOURCES:-}

# fetch_fuse3 APT_DIR DEST: Debian $SUITE's fuse3 source package into DEST, and one
# "sha256  file" line per file in DEST/SHA256SUMS, as the signed Sources index names them
fetch_fuse3() {
    local apt=$1 dest=$2
    [ -r "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
    rm -rf "$apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$dest"
    # the Debian archive this machine's apt already uses (its bookworm suite's URI)
    local mirror=${STRATA_DEBIAN_MIRROR:-$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' \
        | awk '$1 == "bookworm" {print $2; exit}')}
    [ -n "$mirror" ] || die "apt's sources name no bookworm archive (set STRATA_DEBIAN_MIRROR)"
    echo "deb-src [signed-by=$KEYRING] $mirror $SUITE main" >"$apt/sources.list"
    local opts=(
        -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Get::List-Cleanup=false"
    )
    echo "libfuse: fetching Debian $SUITE's fuse3 source package (signed index, hashed files)"
    apt-get "${opts[@]}" -qq update
    # 'URI' FILE SIZE SHA256:HASH, the hash from the Sources index apt just verified
    (cd "$dest" && apt-get "${opts[@]}" -qq --print-uris source fuse3) \
        | sed -nE "s/^'[^']*' (fuse3_[^ ]+) [0-9]+ SHA256:([0-9a-f]{64})$/\2  \1/p" >>"$dest/SHA256SUMS"
    grep -q '\.dsc$' "$dest/SHA256SUMS" || die "apt names no fuse3 .dsc with a SHA256 in $SUITE"
    (cd "$dest" && apt-get "${opts[@]}" -qq --download-only source fuse3)
    (cd "$dest" && sha256sum --check --strict --quiet SHA256SUMS) || die "fuse3 source hashes differ"
}

# check_sources: every file SHA256SUMS names in $SOURCES has its hash
check_sources() {
    [ -f "$SOURCES/SHA256SUMS" ] || die "$SOURCES/SHA256SUMS missing (run: native/build.sh fetch $SOURCES)"
    (cd "$SOURCES" && sha256sum --check --strict --quiet SHA256SUMS) \
        || die "$SOURCES does not match its SHA256SUMS"
}

build_libfuse() {
    local out=$1 src=$1/src
    rm -rf "$src" "$out/libfuse" "$out/libfuse-build"
    mkdir -p "$src"
    if [ -n "$SOURCES" ]; then
        check_sources
        echo "libfuse: the fuse3 source package from $SOURCES (hashes checked)"
        cp "$SOURCES"/fuse3_* "$src/"
    else
        fetch_fuse3 "$out/apt" "$src"
    fi
    local dsc
    dsc=$(ls "$src"/fuse3_*.dsc) || die "no fuse3 .dsc was downloaded"
    # apt checked the .dsc and its files against the signed Sources index (offline: against
    # the hashes fetch took from it); dpkg-source checks the files against the .dsc again,
    # unpacks and applies Debian's patches
    (cd "$src" && dpkg-source -x "$dsc" fuse3 >/dev/null)
    local version
    version=$(grep -m1 -oE "^ *version: *'[0-9.]+'" "$src/fuse3/meson.build" | grep -oE "[0-9][0-9.]*")
    if ! printf '%s\n%s\n' "$LIBFUSE_MIN" "$version" | sort -V -C; then
        die "fuse3 in $SUITE is $version; passthrough needs libfuse >= $LIBFUSE_MIN"
    fi
    echo "libfuse: building $version ($(basename "$dsc")) into $out/libfuse"
    meson setup "$out/libfuse-build" "$src/fuse3" --prefix="$out/libfuse" --libdir=lib \
        --buildtype=release -Dexamples=false -Dtests=false -Dutils=false -Duseroot=false \
        -Dinitscriptdir= -Ddisable-mtab=true >"$out/libfuse-meson.log" \
        || { cat "$out/libfuse-meson.log" >&2; die "meson setup failed"; }
    ninja -C "$out/libfuse-build" >"$out/libfuse-ninja.log" \
        || { tail -40 "$out/libfuse-ninja.log" >&2; die "libfuse build failed"; }
    meson install -C "$out/libfuse-build" >/dev/null
    PKG_CONFIG_PATH="$out/libfuse/lib/pkgconfig" pkg-config --atleast-version="$LIBFUSE_MIN" fuse3 \
        || die "the built libfuse does not report version >= $LIBFUSE_MIN"
    rm -rf "$out/libfuse-build" "$src"
}

# build_venv VENV [PIP_ARGS...]: a throwaway venv with build-requirements.txt (hashes)
build_venv() {
    local venv=$1
    shift
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" -q --disable-pip-version-check install --require-hashes --no-deps \
        --only-binary :all: "$@" -r "$HERE/build-requirements.txt"
}

# fetch_sdist VENV DEST: the pyfuse3 sdist the lock pins, sha256 checked by pip
fetch_sdist() {
    local venv=$1 dest=$2
    echo "pyfuse3: fetching the $PYFUSE3_VERSION sdist (sha256 checked)"
    echo "pyfuse3==$PYFUSE3_VERSION --hash=sha256:$PYFUSE3_SHA256" >"$dest/sdist.txt"
    "$venv/bin/pip" -q --disable-pip-version-check download --no-deps --no-binary :all: \
        --no-build-isolation --require-hashes -d "$dest" -r "$dest/sdist.txt"
    rm "$dest/sdist.txt"
}

build_pyfuse3() {
    local out=$1 work=$1/pyfuse3-src venv=$1/build-venv
    local prefix=$out/libfuse
    [ -f "$prefix/lib/pkgconfig/fuse3.pc" ] || die "$prefix has no libfuse (run: native/build.sh libfuse $out)"
    rm -rf "$work" "$venv" "$out/wheels"
    mkdir -p "$work" "$out/wheels"
    local pip=("$venv/bin/pip" -q --disable-pip-version-check)
    if [ -n "$SOURCES" ]; then
        check_sources
        echo "pyfuse3: the $PYFUSE3_VERSION sdist from $SOURCES (sha256 checked)"
        cp "$SOURCES/pyfuse3-$PYFUSE3_VERSION.tar.gz" "$work/"
        (cd "$work" && echo "$PYFUSE3_SHA256  pyfuse3-$PYFUSE3_VERSION.tar.gz" | sha256sum --check --quiet) \
            || die "the pyfuse3 sdist's sha256 is not $PYFUSE3_SHA256"
        build_venv "$venv" --no-index --find-links "$SOURCES"
    else
        build_venv "$venv"
        fetch_sdist "$venv" "$work"
    fi
    tar xzf "$work/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$work"
    local tree=$work/pyfuse3-$PYFUSE3_VERSION
    patch -d "$tree" -p1 --quiet <"$HERE/pyfuse3-passthrough.patch" || die "the patch does not apply"
    rm -f "$tree/src/pyfuse3/__init__.c"  # generated by Cython from the patched .pyx instead
    echo "pyfuse3: building against $prefix (Cython and setuptools pinned by hash)"
    PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$prefix/lib" \
        "${pip[@]}" wheel --no-build-isolation --no-deps -w "$out/wheels" "$tree" >"$out/pyfuse3-build.log" 2>&1 \
        || { tail -40 "$out/pyfuse3-build.log" >&2; die "pyfuse3 build failed"; }
    ls "$out"/wheels/pyfuse3-"$PYFUSE3_VERSION"-*.whl >/dev/null || die "no wheel was built"
    rm -rf "$work" "$venv"
}

# fetch SOURCES_DIR: what an offline build needs, with SHA256SUMS (see the top)
fetch_sources() {
    local out=$1 tmp=$1.tmp
    rm -rf "$tmp"
    mkdir -p "$tmp/files"
    fetch_fuse3 "$tmp/apt" "$tmp/files"
    echo "pyfuse3: fetching the build requirements' wheels (hashes checked)"
    build_venv "$tmp/venv"
    "$tmp/venv/bin/pip" -q --disable-pip-version-check download --require-hashes --no-deps \
        --only-binary :all: -d "$tmp/files" -r "$HERE/build-requirements.txt"
    fetch_sdist "$tmp/venv" "$tmp/files"
    echo "$PYFUSE3_SHA256  pyfuse3-$PYFUSE3_VERSION.tar.gz" >>"$tmp/files/SHA256SUMS"
    local wheel
    for wheel in "$tmp"/files/*.whl; do  # pip checked them against build-requirements.txt
        (cd "$tmp/files" && sha256sum "$(basename "$wheel")") >>"$tmp/files/SHA256SUMS"
    done
    (cd "$tmp/files" && sha256sum --check --strict --quiet SHA256SUMS) || die "fetched files differ"
    rm -rf "$out"
    mv "$tmp/files" "$out"
    rm -rf "$tmp"
    echo "fetched into $out: $(cd "$out" && ls | tr '\n' ' ')"
}

[ $# -eq 2 ] || die "usage: native/build.sh libfuse|pyfuse3|fetch DIR"
mkdir -p "$2"
out=$(cd "$2" && pwd)
case $1 in
    libfuse) build_libfuse "$out" ;;
    pyfuse3) build_pyfuse3 "$out" ;;
    fetch) fetch_sources "$out" ;;
    *) die "unknown step $1 (libfuse, pyfuse3 or fetch)" ;;
esac
