#!/bin/sh
# mmdebstrap --customize-hook for the runtime base image (localhost/debian-py-slim:bookworm, see
# the Makefile's base-image target): turns a Debian "essential" rootfs with python3-minimal,
# libpython3.11-stdlib, ca-certificates and busybox into a Python-only runtime, like a
# distroless image.
#
# Kept: the packages in KEEP (the C library, the interpreter and the libraries its standard
# modules link, the CA bundle, dash as /bin/sh, busybox) and the dpkg status of exactly those (so
# image scanners still see what is inside). Removed: every other package (perl, coreutils, bash,
# util-linux, dpkg and apt's tools, PAM, ...) with no maintainer script run, glibc's iconv
# modules (gconv: Python's codecs are its own), and the parts of the standard library a service
# never imports. busybox provides the few commands the compose stack's and the chart's wrappers
# call (cat, sleep, timeout; see BUSYBOX_TOOLS). The standard library is compiled to bytecode
# here, as the containers run read-only. Adds the stunner user and group (10001), so no RUN step
# is needed on top of this image.
set -eu
root="$1"

KEEP="base-files base-passwd dash libc6 libc-bin gcc-12-base libgcc-s1 libcrypt1 zlib1g
libexpat1 libssl3 libbz2-1.0 libffi8 liblzma5 libncursesw6 libtinfo6 libreadline8
readline-common libsqlite3-0 libuuid1 libnsl2 libtirpc3 libtirpc-common libgssapi-krb5-2
libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libdb5.3 media-types
libpython3.11-minimal libpython3.11-stdlib python3.11-minimal python3-minimal ca-certificates busybox"

# docker-compose.yml's Redis-password wrapper: cat, sleep; the chart's helm test: timeout. (The
# operator's handoff init container runs python3: services/operator/.../render/handoff.py.)
BUSYBOX_TOOLS="cat sleep timeout"

# The standard library's parts a service never imports (bookworm ships most of the rest, tests,
# idlelib, tkinter, lib2to3 and ensurepip, in packages this image does not install).
STDLIB_DROP="pydoc_data turtledemo turtle.py idlelib tkinter lib2to3 ensurepip test
unittest/test distutils/tests ctypes/test sqlite3/test __phello__ __hello__.py"

chroot "$root" /usr/bin/python3.11 -m compileall -q -j 0 --invalidation-mode unchecked-hash \
    -x '/(test|tests|idlelib|tkinter|lib2to3|turtledemo)/' /usr/lib/python3.11 >/dev/null || true

remove=""
for pkg in $(chroot "$root" dpkg-query -Wf '${Package}\n'); do
    case " $(echo $KEEP) " in
        *" $pkg "*) ;;
        *) remove="$remove $pkg" ;;
    esac
done
# No maintainer script runs: they need the very tools being removed, and nothing they undo
# (alternatives, diversions, services) matters in an image.
for pkg in $remove; do
    rm -f "$root/var/lib/dpkg/info/$pkg".prerm "$root/var/lib/dpkg/info/$pkg".postrm \
        "$root/var/lib/dpkg/info/$pkg":*.prerm "$root/var/lib/dpkg/info/$pkg":*.postrm
done
# dpkg removes itself last, so it runs to the end; its own files go with it.
chroot "$root" dpkg --purge --force-depends --force-remove-essential --force-remove-protected \
    --no-triggers $remove

for part in $STDLIB_DROP; do
    rm -rf "$root/usr/lib/python3.11/$part"
done
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/usr/share/lintian "$root"/usr/share/common-licenses \
    "$root"/var/log/* \
    "$root"/var/cache/debconf "$root"/var/lib/dpkg/*-old
rm -rf "$root"/usr/lib/*-linux-gnu/gconv
for tool in $BUSYBOX_TOOLS; do
    ln -s busybox "$root/usr/bin/$tool"
done
# Links the removed packages' alternatives left behind (awk, pager, which, ...).
chroot "$root" /bin/sh -c 'for f in /usr/bin/* /usr/sbin/*; do
    if [ -L "$f" ] && [ ! -e "$f" ]; then busybox rm "$f"; fi; done'
find "$root/usr/lib/python3.11" -depth -type d -name __pycache__ -empty -delete

echo "stunner:x:10001:" >>"$root/etc/group"
echo "stunner:x:10001:10001:stunner:/nonexistent:/usr/sbin/nologin" >>"$root/etc/passwd"
