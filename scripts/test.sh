#!/usr/bin/env bash
# Runs every test: unit, property, and integration tests against real daemons, a real sshd,
# real sockets and real file systems. Installs what the tests need first (Debian, as root).
#   scripts/test.sh            # everything, then scripts/fuzz.sh (a brief fuzz run, nightly only)
#   scripts/test.sh -- NAME    # only tests whose name contains NAME
#   scripts/test.sh -- python  # the Python client's tests (python/tests), after a build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Transfers record themselves in a history that `tern plan` fits and that picks the next
# transfer's starting stream count: tests must not teach one another (tests/plan.rs sets its own).
export TERN_HISTORY=off

need=()
command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
# The dashboard test: Debian's Chromium driven by Playwright (playwright-core from npm, no
# browser download), and a font so the screenshots have text.
[[ -x /usr/bin/chromium ]] || need+=(chromium)
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v setpriv >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
# The third-party test reads the client's per-socket byte counters with `ss`.
command -v ss >/dev/null || need+=(iproute2)
# tern test's storage cases mount bench/slowdisk.py (FUSE, Debian's python3 with fusepy on libfuse2;
# fusermount from fuse3 to unmount).
[[ -e /usr/lib/python3/dist-packages/fusepy.py ]] || /usr/bin/python3 -c 'import fuse' 2>/dev/null || need+=(python3-fusepy)
compgen -G "/usr/lib/*/libfuse.so.2*" >/dev/null || need+=(libfuse2)
command -v fusermount >/dev/null || need+=(fuse3)
# The service's store tests start a real PostgreSQL server (initdb + postgres, as nobody).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
# ... and a real SMTP server (aiosmtpd, Debian's python3) to receive notification mails.
/usr/bin/python3 -c 'import aiosmtpd' 2>/dev/null || need+=(python3-aiosmtpd)
# The Python client's tests (python/tests) run in a venv: Debian's python3 needs python3-venv.
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  if [[ $EUID -eq 0 ]]; then
    echo "test.sh: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -q
    timeout 900 apt-get install -y -q --no-install-recommends "${need[@]}"
  else
    echo "test.sh: missing ${need[*]} (run as root to install; the tests that need them will skip)" >&2
  fi
fi
mkdir -p /run/sshd 2>/dev/null || true
if command -v npm >/dev/null; then
  # Exactly the locked versions; quiet unless it fails.
  (cd crates/tern-service/web-tests && timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
    || echo "test.sh: npm ci in crates/tern-service/web-tests failed (the dashboard test will fail under CI, skip elsewhere)" >&2
fi

filter=()
if [[ ${1:-} == "--" ]]; then filter=("${@:2}"); fi
# Two test threads: the integration tests each run several tern processes on this 2-core box.
timeout 2400 cargo test --workspace --locked --no-fail-fast -- --test-threads=2 "${filter[@]}"

# A brief libFuzzer run per fuzz target (20 s each, ~110 s in all once fuzz/target is built;
# skipped without nightly). The stable replay of the committed corpus already ran above
# (tern-proto's fuzz_corpus test).
if ((${#filter[@]} == 0)); then
  scripts/fuzz.sh
fi

# The Python client (python/, docs/python.md) against the tern binary cargo just built: pytest
# starts a real `tern serve` from it. pytest and the package's build backend come from PyPI.
# A -- NAME filter names Rust tests, so it skips these unless one of its words is `python`.
if ((${#filter[@]})) && [[ " ${filter[*]} " != *" python "* ]]; then
  exit 0
fi
tern_bin="$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/tern"
[[ -x $tern_bin ]] || timeout 1800 cargo build -p tern --locked
venv=target/pyvenv
"$venv/bin/python" -c '' 2>/dev/null || python3 -m venv --clear "$venv"
timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check --upgrade pytest
timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./python
TERN_BIN="$tern_bin" timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
