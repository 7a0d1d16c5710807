#!/usr/bin/env bash
# Install what is missing, then run the demo or the test suite.
#   bash scripts/run.sh demo [zkcrawl demo flags...]
#   bash scripts/run.sh test [pytest args...]
# Works on a fresh Debian/Ubuntu machine as root (apt-get), or as a user who
# already has ZooKeeper, Java and python3-venv installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${ZKCRAWL_VENV:-$here/.venv}"
what="${1:-}"
shift || true

say() { printf '==> %s\n' "$*" >&2; }

apt_install() {
  # $@: Debian packages. Only as root; otherwise say what is missing and stop.
  if [ "$(id -u)" != 0 ]; then
    say "missing: $*; install with: sudo apt-get install -y $*"
    exit 2
  fi
  if [ -z "${_apt_updated:-}" ]; then
    say "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _apt_updated=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need_system() {
  local pkgs=()
  if [ -z "${ZOOKEEPER_HOME:-}" ] && [ ! -e /usr/share/java/zookeeper.jar ]; then
    pkgs+=(zookeeper)
  fi
  command -v java >/dev/null 2>&1 || pkgs+=(default-jre-headless)
  command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    pkgs+=(python3-venv python3-pip)
  fi
  if [ "$what" = test ] && ! command -v chromium >/dev/null 2>&1; then
    pkgs+=(chromium)  # the HTML report is checked in a real headless browser
  fi
  if [ "${#pkgs[@]}" -gt 0 ]; then
    apt_install "${pkgs[@]}"
  fi
}

need_venv() {
  local stamp="$venv/.zkcrawl-installed"
  if [ ! -x "$venv/bin/python" ]; then
    say "creating virtualenv $venv"
    python3 -m venv "$venv"
  fi
  if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    say "installing zkcrawl and its test extra into $venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e ".[test]"
    touch "$stamp"
  fi
}

kazoo_edges() {
  # zkcrawl/zk/wire.py leans on kazoo internals (KazooClient._call, its serialization
  # structs): the adapter's contract tests also run against the oldest kazoo pyproject.toml
  # allows and the newest one published, each shadowing the installed one on PYTHONPATH.
  local spec dir
  for spec in "kazoo==2.10.0" "kazoo"; do
    dir="$(mktemp -d)"
    "$venv/bin/python" -m pip install -q --no-deps --upgrade --target "$dir" "$spec" >/dev/null
    say "zookeeper adapter against $(ls "$dir" | grep -m1 '^kazoo-.*dist-info' || echo "$spec")"
    PYTHONPATH="$dir" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      tests/test_zk.py tests/test_queue.py tests/test_claimlog.py
    rm -rf "$dir"
  done
}

case "$what" in
  demo)
    need_system
    need_venv
    exec "$venv/bin/zkcrawl" demo "$@"
    ;;
  test)
    need_system
    need_venv
    say "ruff check"
    "$venv/bin/ruff" check .
    say "mypy (strict, see pyproject.toml): zkcrawl/zk zkcrawl/queue consumer"
    "$venv/bin/mypy" zkcrawl/zk zkcrawl/queue consumer
    if [ "$#" -eq 0 ]; then
      kazoo_edges
    fi
    say "pytest"
    exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
    ;;
  *)
    echo "usage: bash scripts/run.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
