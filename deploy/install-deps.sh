#!/usr/bin/env bash
# Installs what is missing, and only that, for one of two purposes (safe to run again; does nothing when all is there):
#
#   deploy/install-deps.sh --product   what building ils-gateway and running it with the sample backend need
#                                      (deploy/quickstart.sh): libsodium (identity and end-to-end crypto), SQLite
#                                      (the controller's store), libqrencode (admin identity create --qr), curl and
#                                      iproute2's ss (the quickstart's request and its no-listening-socket check), and
#                                      the sample backend's Python packages (deploy/backend/requirements.txt)
#   deploy/install-deps.sh [--tests]   the above, and what the tests need besides (deploy/test.sh, CI): openssl,
#                                      sqlite3, iptables (the fault tests' network namespaces), PostgreSQL (the store
#                                      tests start their own server), gdb (a hung test run's backtraces), zbar-tools
#                                      (QR codes read back), Chromium and its driver (the console's browser tests), and
#                                      the tests' Python packages (Tests/e2e/requirements.txt)
#
#   --dry-run   prints the Debian and PyPI packages it would install, and installs nothing
set -euo pipefail
cd "$(dirname "$0")/.."

purpose=tests
dry_run=false
for argument in "$@"; do
    case "$argument" in
        --product) purpose=product ;;
        --tests) purpose=tests ;;
        --dry-run) dry_run=true ;;
        -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install-deps.sh: unknown option '$argument' (--product, --tests, --dry-run)" >&2; exit 64 ;;
    esac
done

need_apt=()
need_pip=()
# python_needs MODULE... -- PACKAGE...: the PyPI packages, when any of the modules does not import.
python_needs() {
    local modules=()
    while [ "$1" != "--" ]; do modules+=("$1"); shift; done
    shift
    local module
    for module in "${modules[@]}"; do
        if ! python3 -c "import $module" 2>/dev/null; then
            need_pip+=("$@")
            return
        fi
    done
}

# The product.
pkg-config --exists libsodium 2>/dev/null || need_apt+=(libsodium-dev pkg-config)
pkg-config --exists sqlite3 2>/dev/null || need_apt+=(libsqlite3-dev pkg-config)
pkg-config --exists libqrencode 2>/dev/null || need_apt+=(libqrencode-dev pkg-config)
command -v curl >/dev/null || need_apt+=(curl)
command -v ss >/dev/null || need_apt+=(iproute2)
python_needs fastapi uvicorn sse_starlette websockets -- --requirement=deploy/backend/requirements.txt

if [ "$purpose" = tests ]; then
    command -v openssl >/dev/null || need_apt+=(openssl)
    command -v sqlite3 >/dev/null || need_apt+=(sqlite3)   # docs/operations.md's online backup
    command -v iptables >/dev/null || need_apt+=(iptables)   # the silent-drop tests (a NAT that forgets a link)
    # PostgreSQL's server binaries: the store tests start their own server (initdb into a temporary directory).
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
    # A test run that hangs is stopped with every thread's backtrace (deploy/bounded.sh).
    command -v gdb >/dev/null || need_apt+=(gdb)
    command -v zbarimg >/dev/null || need_apt+=(zbar-tools)   # the QR tests read codes back with a real decoder
    # The console's browser tests (Tests/e2e/test_console_browser.py): Debian's Chromium and its driver, so selenium
    # never downloads a browser.
    command -v chromium >/dev/null || need_apt+=(chromium)
    command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
    # httpx, pytest and PyYAML for the e2e tests; selenium drives the browser tests (with Debian's chromedriver;
    # Selenium Manager is never used); sslyze the TLS profile test (it pins cryptography below 47); h2 and
    # cryptography the device client written from docs/protocol.md alone (Tests/e2e/resume_client.py).
    python_needs httpx pytest yaml selenium sslyze h2 cryptography -- --requirement=Tests/e2e/requirements.txt
fi

# pip itself, when something is to be installed with it (Debian's python3 comes without).
if ((${#need_pip[@]})) && ! python3 -m pip --version >/dev/null 2>&1; then need_apt+=(python3-pip); fi

# Each package once, in the order first asked for.
dedup() { printf '%s\n' "$@" | awk 'NF && !seen[$0]++'; }
mapfile -t need_apt < <(dedup "${need_apt[@]+"${need_apt[@]}"}")
mapfile -t need_pip < <(dedup "${need_pip[@]+"${need_pip[@]}"}")

if $dry_run; then
    echo "purpose: $purpose"
    echo "debian: ${need_apt[*]}"
    echo "pypi: ${need_pip[*]}"
    exit 0
fi

if ((${#need_apt[@]})); then
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    echo "installing Debian packages: ${need_apt[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ((${#need_pip[@]})); then
    echo "installing Python packages: ${need_pip[*]}" >&2
    python3 -m pip install -q --disable-pip-version-check "${need_pip[@]}" \
        || python3 -m pip install -q --disable-pip-version-check --break-system-packages "${need_pip[@]}"
fi
