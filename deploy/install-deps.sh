#!/usr/bin/env bash
# Installs what building, testing and the quickstart need, only when it is missing:
# libsodium (the identity and end-to-end crypto), SQLite (the controller's store), openssl and curl (certificates and demo requests),
# iptables and iproute2 (the fault tests' network namespaces), PostgreSQL (the store tests start their own server),
# and the Python packages of the sample backend and the end-to-end tests.
# Safe to run again; does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
pkg-config --exists libsodium 2>/dev/null || need_apt+=(libsodium-dev pkg-config)
pkg-config --exists sqlite3 2>/dev/null || need_apt+=(libsqlite3-dev pkg-config)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v curl >/dev/null || need_apt+=(curl)
command -v sqlite3 >/dev/null || need_apt+=(sqlite3)   # docs/operations.md's online backup
command -v iptables >/dev/null || need_apt+=(iptables)   # the silent-drop tests (a NAT that forgets a link)
command -v ss >/dev/null || need_apt+=(iproute2)
# PostgreSQL's server binaries: the store tests start their own server (initdb into a temporary directory).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
# A test run that hangs is stopped with every thread's backtrace (deploy/bounded.sh).
command -v gdb >/dev/null || need_apt+=(gdb)
pkg-config --exists libqrencode 2>/dev/null || need_apt+=(libqrencode-dev pkg-config)   # admin identity create --qr
command -v zbarimg >/dev/null || need_apt+=(zbar-tools)   # the QR tests read codes back with a real decoder
# The console's browser tests (Tests/e2e/test_console_browser.py): Debian's Chromium and its driver, so selenium
# never downloads a browser.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    echo "installing Debian packages: ${need_apt[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! python3 -c 'import fastapi, uvicorn, sse_starlette, httpx, websockets, pytest, yaml' 2>/dev/null; then
    echo "installing Python packages from deploy/backend/requirements.txt" >&2
    python3 -m pip install -q --disable-pip-version-check -r deploy/backend/requirements.txt \
        || python3 -m pip install -q --disable-pip-version-check --break-system-packages -r deploy/backend/requirements.txt
fi

# selenium drives the console's browser tests (with Debian's chromedriver; Selenium Manager is never used).
if ! python3 -c 'import selenium' 2>/dev/null; then
    echo "installing selenium from PyPI" >&2
    python3 -m pip install -q --disable-pip-version-check 'selenium>=4.11' \
        || python3 -m pip install -q --disable-pip-version-check --break-system-packages 'selenium>=4.11'
fi

# sslyze for the TLS profile test (Tests/e2e/test_tls_profile.py); it pins cryptography below 47.
if ! python3 -c 'import sslyze' 2>/dev/null; then
    echo "installing sslyze from PyPI" >&2
    python3 -m pip install -q --disable-pip-version-check sslyze \
        || python3 -m pip install -q --disable-pip-version-check --break-system-packages sslyze
fi
