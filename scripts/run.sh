#!/usr/bin/env bash
# Install what is missing, then run the demo or the test suite.
#   bash scripts/run.sh demo [zkcrawl demo flags...]
#   bash scripts/run.sh test [pytest args...]
# Works on a fresh Debian/Ubuntu machine as root (apt-get), or as a user who
# already has ZooKeeper, Java and python3-venv installed (and PostgreSQL for the tests).
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
  if [ "$what" = test ] && ! compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null; then
    pkgs+=(postgresql)  # the PostgreSQL sink is tested against a real server (zkcrawl/admin/localpg.py)
  fi
  if [ "$what" = test ] && ! command -v ip >/dev/null 2>&1; then
    pkgs+=(iproute2)  # tests/faults: a consumer partitioned in a network namespace
  fi
  if [ "$what" = test ] && ! command -v chromium >/dev/null 2>&1; then
    pkgs+=(chromium)  # the HTML report is checked in a real headless browser
  fi
  if [ "$what" = test ] && ! command -v promtool >/dev/null 2>&1; then
    pkgs+=(prometheus)  # promtool: tests/test_monitoring.py checks and unit-tests the alerts
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
    "$venv/bin/python" -m pip install -q -e ".[test]"  # the test extra includes the docs build
    touch "$stamp"
  fi
}

dependency_edges() {
  # The lower bounds of pyproject.toml are tested, not guessed: the web, queue,
  # ZooKeeper and PostgreSQL sink tests run with exactly those versions shadowing the
  # installed ones on PYTHONPATH. And zkcrawl/zk/wire.py leans on kazoo internals (KazooClient._call, its
  # serialization structs), so the adapter's contract tests also run against the newest
  # kazoo published, past our upper bound; so does ZkClient.silent_for (two more kazoo
  # internals: tests/faults/test_silence.py).
  local dir
  dir="$(mktemp -d)"
  "$venv/bin/python" - > "$dir/lowest.txt" <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
# The postgres extra too: psycopg[binary] is psycopg plus psycopg-binary of one version
# (--no-deps installs no extra, so both are named).
for dep in project["dependencies"] + project["optional-dependencies"]["postgres"]:
    name, extra, low = re.match(r"([A-Za-z0-9_.-]+)(\[\w+\])?\s*>=\s*([0-9][^,;\s]*)",
                                dep).groups()
    print(f"{name}=={low}")
    if extra == "[binary]":
        print(f"{name}-binary=={low}")
PY
  say "lowest allowed versions: $(tr '\n' ' ' < "$dir/lowest.txt")"
  "$venv/bin/python" -m pip install -q --no-deps --target "$dir/lowest" -r "$dir/lowest.txt" \
    >/dev/null
  PYTHONPATH="$dir/lowest" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_fetch.py tests/test_ssrf.py tests/test_decode.py tests/test_extract.py \
    tests/test_robots.py tests/test_urls.py tests/test_zk.py tests/test_ingress.py \
    tests/test_owned_queue.py tests/test_consumer_pipeline.py tests/test_seen.py
  PYTHONPATH="$dir/lowest" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_sink_postgres.py -m "not slow"  # the lowest psycopg against a real server
  "$venv/bin/python" -m pip install -q --no-deps --upgrade --target "$dir/newest" kazoo \
    >/dev/null
  say "zookeeper adapter against $(ls "$dir/newest" | grep -m1 '^kazoo-.*dist-info')"
  PYTHONPATH="$dir/newest" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_zk.py tests/test_ingress.py tests/test_owned_queue.py tests/faults/test_silence.py
  rm -rf "$dir"
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
    # -p zkcrawl: zkcrawl.producer and zkcrawl.consumer included, under those names (through
    # the symlinks zkcrawl/producer and zkcrawl/consumer to the top-level directories).
    say "mypy (strict, see pyproject.toml): -p zkcrawl"
    "$venv/bin/mypy" -p zkcrawl
    say "docs: mkdocs build --strict (no broken link or anchor, no page outside the nav)"
    docs_site="$(mktemp -d)"
    # Not --quiet: it hides the warnings from --strict as well, and the build passes with them.
    if ! NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --site-dir "$docs_site" \
        > "$docs_site.log" 2>&1; then
      grep -v "^INFO" "$docs_site.log" >&2 || true
      echo "docs: the strict build failed (above)" >&2
      exit 1
    fi
    rm -f "$docs_site.log"
    rm -rf "$docs_site"
    if [ "$#" -eq 0 ]; then
      dependency_edges
    fi
    if [ "$#" -gt 0 ]; then
      say "pytest $*"
      exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
    fi
    # Two workers for the tests that do not kill servers (pytest-xdist; a module's tests stay
    # on one worker, with its module-scoped servers); then the fault tests alone, one at a
    # time, as they are timed against sessions and outages.
    say "pytest: all but the fault tests, two workers"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadscope -m "not faults"
    say "pytest: the fault tests (tests/faults), alone"
    exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m faults
    ;;
  *)
    echo "usage: bash scripts/run.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
