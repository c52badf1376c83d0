#!/usr/bin/env bash
# Run `make test` (or another target) as a fresh machine would, on a machine that is not fresh: a new clone, empty
# caches (pip, SpecDeck's conversions), and a PATH holding only the programs of a fresh Debian 12 with Python and the
# build tools (Debian's required/important/standard packages, gcc/g++/make/binutils, python3) — so a test or a set-up
# step that uses a program `make` does not install (xvfb-run, cmake, git, curl, ImageMagick...) fails here, as it
# would there (programs from the Debian packages that `make` itself installs with apt — DEB_* in the Makefile — are
# kept: a fresh machine has them once make ran). The clone is made from this checkout's HEAD plus its uncommitted
# changes.
#
#   resources/setup/fresh_check.sh [--committed] [DIR] [MAKE TARGET AND ARGS...]   default: /tmp/specdeck-fresh test
#   --committed: HEAD only, without the checkout's uncommitted changes
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
committed=0; [[ ${1:-} == --committed ]] && { committed=1; shift; }
dir="${1:-/tmp/specdeck-fresh}"; shift || true
[[ $# -gt 0 ]] || set -- test
rm -rf "$dir"; mkdir -p "$dir"
git clone -q "$src" "$dir/repo"
if (( ! committed )); then
  (cd "$src" && git diff HEAD) | (cd "$dir/repo" && git apply --allow-empty)
  (cd "$src" && git ls-files --others --exclude-standard -z) | (cd "$src" && xargs -0 -r cp --parents -t "$dir/repo")
fi

bin="$dir/bin"; mkdir -p "$bin"
pkgs=$(dpkg-query -W -f='${Package} ${Priority}\n' | awk '$2=="required"||$2=="important"||$2=="standard"{print $1}')
pkgs+=" $(dpkg-query -W -f='${Package}\n' 'gcc*' 'g++*' 'cpp*' 'binutils*' make libc-bin libc-dev-bin 2>/dev/null | tr '\n' ' ')"
# and what `make` itself installs with apt (DEB_* in the Makefile): present on a fresh machine once make ran
deb=$(make -s -C "$src" -f - print-deb <<<'include Makefile
print-deb: ; @echo $(DEB_BUILD) $(DEB_TEST) $(DEB_GUI)' 2>/dev/null || true)
pkgs+=" $deb"
for p in $pkgs; do
  dpkg -L "$p" 2>/dev/null | grep -E '^/(usr/)?s?bin/[^/]+$' || true
done | sort -u | while read -r f; do [[ -x $f && ! -e $bin/$(basename "$f") ]] && ln -s "$f" "$bin/$(basename "$f")"; done
# names Debian gives through /etc/alternatives (awk → mawk, pager, editor…) when what they point at is in the set
for f in /usr/bin/* /bin/* /usr/sbin/* /sbin/*; do
  [[ -L $f && $(readlink "$f") == /etc/alternatives/* && ! -e $bin/$(basename "$f") ]] || continue
  [[ -e $bin/$(basename "$(readlink -f "$f")") ]] && ln -s "$f" "$bin/$(basename "$f")"
done
py=$(command -v python3); ln -sf "$(readlink -f "$py")" "$bin/python3"
for tool in cmake xvfb-run Xvfb import git curl; do [[ -e $bin/$tool ]] && echo "note: $tool is part of the base set"; done

mkdir -p "$dir/home" "$dir/pip-cache"
cd "$dir/repo"
echo "fresh check in $dir/repo: PATH has $(ls "$bin" | wc -l) programs; make $*"
# the machine's own settings (pip's index, certificates, proxies) stay; home, caches and programs are new
env -u DISPLAY -u WAYLAND_DISPLAY -u XDG_CACHE_HOME -u VIRTUAL_ENV HOME="$dir/home" PATH="$bin" PIP_CACHE_DIR="$dir/pip-cache" \
  bash -c "time make $(printf '%q ' "$@")"
