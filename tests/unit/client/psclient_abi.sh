#!/bin/sh
# psclient_abi.sh SO BUILD_DIR CMAKE CC [CXX]: libpsclient.so as an outside user meets it.
#   (a) the library exports exactly the functions psclient.h declares PSC_EXTERN, psc_* only
#       (none of the pc_* of ember_common linked into it), per nm -D --defined-only;
#   (b) its soname is libpsclient.so.<PSC_VERSION_MAJOR> and its file libpsclient.so.<M.m.p>;
#   (c) `cmake --install` into a temporary prefix gives the library (with its symlinks), the
#       header and libpsclient.pc; the header compiles alone (C11 -Wpedantic, and as C++); a
#       program built against only the installed header and library (psclient_abi_prog.c) runs
#       with LD_LIBRARY_PATH and gets clean errors; so does one built with pkg-config's flags,
#       and Python's ctypes loads the library and reads its version.
# $PSC_ABI_CFLAGS: extra flags for those programs (the sanitizer of a sanitized build).
# Every step is bounded in time.
set -eu
so=$1 build=$2 cmake=$3 cc=$4 cxx=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
cflags=${PSC_ABI_CFLAGS:-}
tmp=$(mktemp -d /tmp/ember-psc-abi-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# (c, first part) install, so that (a) compares against the installed header.
p=$tmp/prefix
timeout 60 "$cmake" --install "$build" --prefix "$p" --component psclient >"$tmp/install.txt" ||
    { cat "$tmp/install.txt"; fail "cmake --install"; }
hdr=$p/include/emberps/psclient.h
[ -f "$hdr" ] || fail "no include/emberps/psclient.h in the install"
lnk=$(find "$p" -name libpsclient.so)
[ -n "$lnk" ] || fail "no libpsclient.so in the install"
lib=$(dirname "$lnk")
ls -l "$lib"
major=$(sed -n 's/^#define PSC_VERSION_MAJOR \([0-9]*\).*/\1/p' "$hdr")
minor=$(sed -n 's/^#define PSC_VERSION_MINOR \([0-9]*\).*/\1/p' "$hdr")
patch=$(sed -n 's/^#define PSC_VERSION_PATCH \([0-9]*\).*/\1/p' "$hdr")
if [ -z "$major" ] || [ -z "$minor" ] || [ -z "$patch" ]; then fail "no PSC_VERSION_* in psclient.h"; fi
[ "$(readlink "$lib/libpsclient.so")" = "libpsclient.so.$major" ] ||
    fail "libpsclient.so does not point to libpsclient.so.$major"
[ "$(readlink "$lib/libpsclient.so.$major")" = "libpsclient.so.$major.$minor.$patch" ] ||
    fail "libpsclient.so.$major does not point to libpsclient.so.$major.$minor.$patch"
[ -f "$lib/libpsclient.so.$major.$minor.$patch" ] || fail "no libpsclient.so.$major.$minor.$patch"
[ -f "$lib/pkgconfig/libpsclient.pc" ] || fail "no pkgconfig/libpsclient.pc"

# (a) exports: the built library and the installed one, each against the header's list.
sed -n 's/^PSC_EXTERN [^(]*[ *]\(psc_[a-z0-9_]*\)(.*/\1/p' "$hdr" | sort >"$tmp/declared"
[ "$(wc -l <"$tmp/declared")" -ge 10 ] || fail "cannot read the PSC_EXTERN functions of psclient.h"
for f in "$so" "$lib/libpsclient.so.$major.$minor.$patch"; do
    nm -D --defined-only "$f" | awk '{ print $NF }' | sed 's/@.*//' |
        grep -v -x -E '_init|_fini|_edata|_end|__bss_start' | sort >"$tmp/exported"
    if ! cmp -s "$tmp/declared" "$tmp/exported"; then
        echo "declared (<) vs exported (>) by $f:"
        diff "$tmp/declared" "$tmp/exported" || true
        fail "$f exports other symbols than psclient.h's psc_* functions"
    fi
done
echo "exports: $(tr '\n' ' ' <"$tmp/exported")"

# (b) soname and file name.
for f in "$so" "$lib/libpsclient.so.$major.$minor.$patch"; do
    soname=$(readelf -d "$f" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    [ "$soname" = "libpsclient.so.$major" ] || fail "$f: soname '$soname', want libpsclient.so.$major"
done
[ "$(basename "$so")" = "libpsclient.so.$major.$minor.$patch" ] ||
    fail "built file $(basename "$so"), want libpsclient.so.$major.$minor.$patch"
echo "soname: libpsclient.so.$major"

# (c) the header alone, then programs built against the install only.
timeout 60 "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c "$hdr" ||
    fail "psclient.h does not compile alone as C11"
if [ -n "$cxx" ]; then
    timeout 60 "$cxx" -std=c++11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c++ "$hdr" ||
        fail "psclient.h does not compile alone as C++"
fi
cp "$here/psclient_abi_prog.c" "$tmp/prog.c"
# shellcheck disable=SC2086 # $cflags is a list of flags
timeout 60 "$cc" -std=c11 -Wall -Wextra -Werror $cflags "$tmp/prog.c" -I"$p/include" -L"$lib" \
    -lpsclient -o "$tmp/prog" || fail "cannot build a program against the installed library"
LD_LIBRARY_PATH=$lib ldd "$tmp/prog" | grep -q -F "$lib/libpsclient.so.$major " ||
    fail "the program does not load the installed libpsclient.so.$major"
LD_LIBRARY_PATH=$lib timeout 30 "$tmp/prog" || fail "the program against the install failed"
if command -v pkg-config >/dev/null; then
    flags=$(PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --cflags --libs libpsclient) ||
        fail "pkg-config libpsclient"
    echo "pkg-config: $flags"
    # shellcheck disable=SC2086
    timeout 60 "$cc" -std=c11 $cflags "$tmp/prog.c" $flags -o "$tmp/prog2" ||
        fail "cannot build with pkg-config's flags"
    LD_LIBRARY_PATH=$lib timeout 30 "$tmp/prog2" >/dev/null || fail "the pkg-config build failed"
fi
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3 || true)
if [ -n "$py" ] && [ -z "$cflags" ]; then
    v=$(timeout 30 "$py" -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.psc_version_string.restype = ctypes.c_char_p
print(lib.psc_version() >> 16, lib.psc_version_string().decode())' "$lib/libpsclient.so.$major") ||
        fail "ctypes cannot load the library"
    [ "$v" = "$major $major.$minor.$patch" ] || fail "ctypes read '$v'"
    echo "ctypes: $v"
fi
echo "ok"
