#!/bin/sh
# Builds the wasm backend's interpreter: CPython for wasm32-wasi, from
# Debian's python3.11 source package, with Debian's clang-14, lld-14 and
# wasi-libc (scripts/wasm/deps.sh installs them). Nothing is downloaded
# from anywhere but Debian's archive.
#
# Output, in $VIVARIUM_WASM_DIR (default build/wasm):
#   python.wasm              the interpreter
#   lib/python3.11/          its standard library, compiled to .pyc
#   BUILD-INFO               what it was built from
#
# Steps, in order: fetch and unpack the source package (Debian's patches
# applied), build zlib for wasm32 from Debian's zlib source package,
# configure CPython as a cross build (host wasm32-unknown-wasi, the host's
# python3.11 as the build Python), make, then assemble the tree above.
# The work tree stays in $VIVARIUM_WASM_DIR/work, so a second run only
# redoes what changed.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${VIVARIUM_WASM_DIR:-$root/build/wasm}
work=$out/work
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$work"
cd "$work"

step() { echo "wasm: $*" >&2; }

# 1. Sources, from Debian's archive (deb-src lines: see deps.sh).
fetch() { # package -> directory with the unpacked source
	pkg=$1
	if [ ! -d "src-$pkg" ]; then
		step "fetching the $pkg source package"
		rm -rf "dl-$pkg" && mkdir "dl-$pkg"
		# The newest version first; a mirror may lack it (security
		# updates move), so older ones are tried in turn.
		ok=""
		for v in $(apt-cache showsrc "$pkg" | awk '/^Version:/ {print $2}' | sort -r -V); do
			if (cd "dl-$pkg" && apt-get source -qq --download-only "$pkg=$v" >/dev/null 2>&1); then
				ok=$v
				break
			fi
			rm -f "dl-$pkg"/*
		done
		[ -n "$ok" ] || { echo "wasm: cannot fetch the $pkg source package (deb-src lines missing? run scripts/wasm/deps.sh)" >&2; exit 1; }
		dpkg-source -x "dl-$pkg"/*.dsc "src-$pkg.tmp" >/dev/null
		echo "$pkg $ok" > "src-$pkg.tmp/.vivarium-version"
		mv "src-$pkg.tmp" "src-$pkg"
	fi
}
fetch python3.11
fetch zlib
src=$work/src-python3.11

# 2. A sysroot of wasi-libc only: clang's default search path for
# wasm32-wasi also has the host's /usr/include, where configure would find
# headers of libraries that do not exist for wasm32.
sysroot=$work/sysroot
mkdir -p "$sysroot/include" "$sysroot/lib"
ln -sfn /usr/include/wasm32-wasi "$sysroot/include/wasm32-wasi"
ln -sfn /usr/lib/wasm32-wasi "$sysroot/lib/wasm32-wasi"
CC="clang-14 --target=wasm32-wasi --sysroot=$sysroot"
AR=llvm-ar-14
RANLIB=llvm-ranlib-14
export AR RANLIB

# 3. zlib, static, into its own prefix.
zprefix=$work/zlib
if [ ! -f "$zprefix/lib/libz.a" ]; then
	step "building zlib"
	rm -rf zlib-obj && cp -r src-zlib zlib-obj
	(cd zlib-obj && CC="$CC" CFLAGS="-O2" CHOST=wasm32 ./configure --static --prefix="$zprefix" >/dev/null &&
		make -j"$jobs" libz.a >/dev/null && make install >/dev/null)
fi

# 4. CPython.
obj=$work/obj
mkdir -p "$obj/Modules"
if [ ! -f "$obj/Makefile" ]; then
	step "configuring CPython"
	touch "$obj/Modules/Setup.local"
	# pkg-config sees our zlib and nothing of the host's libraries.
	cat "$src/Tools/wasm/config.site-wasm32-wasi" "$root/scripts/wasm/config.site" > "$obj/config.site"
	(cd "$obj" && CONFIG_SITE="$obj/config.site" \
		PKG_CONFIG_PATH="" PKG_CONFIG_LIBDIR="$zprefix/lib/pkgconfig" \
		CC="$CC" ZLIB_CFLAGS="-I$zprefix/include" ZLIB_LIBS="-L$zprefix/lib -lz" \
		"$src/configure" -C --host=wasm32-unknown-wasi --build="$("$src/config.guess")" \
		--with-build-python=/usr/bin/python3.11 --prefix=/usr/local \
		--disable-test-modules --without-ensurepip > configure.log 2>&1) ||
		{ tail -30 "$obj/configure.log" >&2; exit 1; }
fi
step "compiling CPython ($jobs jobs)"
(cd "$obj" && make -j"$jobs" all > make.log 2>&1) || { tail -40 "$obj/make.log" >&2; exit 1; }

# 5. The tree the backend mounts.
step "assembling $out"
stage=$out/stage
rm -rf "$stage" && mkdir -p "$stage/lib/python3.11/lib-dynload"
# Everything of Lib but what cannot run without processes, a GUI or a
# terminal, and the test suite.
(cd "$src/Lib" && tar cf - --exclude='__pycache__' --exclude='test' --exclude='tests' \
	--exclude='idlelib' --exclude='tkinter' --exclude='turtledemo' --exclude='ensurepip' \
	--exclude='lib2to3' --exclude='venv' --exclude='pydoc_data' --exclude='distutils' .) |
	(cd "$stage/lib/python3.11" && tar xf -)
cp "$obj/build/lib.wasi-wasm32-3.11/_sysconfigdata__wasi_wasm32-wasi.py" "$stage/lib/python3.11/" 2>/dev/null ||
	cp "$obj"/build/lib.*/_sysconfigdata_*.py "$stage/lib/python3.11/"
# Byte-compiled now: the library is read-only in the sandbox. Unchecked
# hashes: the .pyc files are trusted as they are, without a stat of their
# source at every import.
/usr/bin/python3.11 -m compileall -q -j"$jobs" --invalidation-mode unchecked-hash "$stage/lib/python3.11" >/dev/null
# Without DWARF: a third of the size, so faster to load, and no debug
# information for the runtime to parse when the interpreter exits.
llvm-strip-14 --strip-debug "$obj/python.wasm" -o "$stage/python.wasm"
{
	cat "$src/.vivarium-version" "$work/src-zlib/.vivarium-version"
	clang-14 --version | head -1
	echo "wasi-libc $(dpkg-query -W -f='${Version}' wasi-libc 2>/dev/null || echo unknown)"
} > "$stage/BUILD-INFO"
rm -rf "$out/lib" "$out/BUILD-INFO"
mv "$stage/lib" "$out/lib"
mv "$stage/BUILD-INFO" "$out/BUILD-INFO"
# python.wasm last: its presence means the tree is complete.
mv "$stage/python.wasm" "$out/python.wasm"
rm -rf "$stage"
step "done: $out/python.wasm"
