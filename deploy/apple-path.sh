#!/usr/bin/env bash
# ILSClient's Apple code path, proved on Linux (issue 24; docs/client-library.md, "What is tested where"; issue 36
# made it one build of ILSClient's closure instead of a second build of the whole package):
#  1. the target rules (deploy/check-targets.sh): ILSClient's dependency closure holds no system-library target and
#     no unguarded Glibc/CSodium import (deploy/check-client-closure.sh), roles import no role, and nothing
#     server-side imports ILSClient;
#  2. ILSClient and its closure build with the AppleCodePath trait, which leaves out BoringSSL's in-place AEAD and
#     seals end-to-end records through swift-crypto's Swift API, the code CryptoKit serves on iOS, macOS and visionOS;
#  3. the device side's tests run on that code: the Swift suites of the records and circuits (crypto, fabric), then
#     the end-to-end overlay and client tests (real binaries: a device, a relay and a gateway sealing and opening
#     every record that way), with ILS_AEAD=swift-crypto-api, which selects the same Swift-API path at run time in
#     the ordinary build (Sources/ILSCrypto/E2ERecords.swift; AEADPathTests fails if it does not). The overlay,
#     client and tunnel suites ran here too until issue 38 put CI at its 35-minute bound: they add no AEAD path the
#     end-to-end tests do not take (about 2 minutes); `--full` still runs them.
# Needs the ordinary build (deploy/test.sh, or swift build --build-tests). The trait build goes last and into the
# ordinary build directory: the trait changes the flags of this package's targets only, so it recompiles ILSClient's
# seven targets of ours (about 20 s) and none of the dependencies (a separate directory took 5 minutes). The next
# ordinary `swift build` recompiles those seven again.
#
#   deploy/apple-path.sh          # what CI runs
#   deploy/apple-path.sh --full   # every target built with the trait (.build-apple, a whole second build) and the
#                                 # same tests on it: run it before changing ILSCrypto's #if ILS_APPLE_CODE_PATH code
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --full ]; then
    scratch=.build-apple
    echo "== swift build --build-tests --traits AppleCodePath (into $scratch)" >&2
    swift build --build-tests --traits AppleCodePath --scratch-path "$scratch"
    echo "== the device side's Swift suites, AppleCodePath build" >&2
    swift test --skip-build --traits AppleCodePath --scratch-path "$scratch" \
        --filter 'ILSCryptoTests|ILSFabricTests|ILSOverlayTests|ILSClientTests|ILSTunnelTests'
    bin="$(swift build --traits AppleCodePath --scratch-path "$scratch" --show-bin-path)"
    echo "== end-to-end overlay and client tests, AppleCodePath binaries ($bin)" >&2
    # ILS_AEAD only tells test_overlay.py which aead= to expect: the trait build always takes the Swift-API path.
    ILS_AEAD=swift-crypto-api ILS_BIN="$bin/ils-gateway" ILS_CLIENT_EXAMPLE_BIN="$bin/ils-client-example" \
        python3 -m pytest -q Tests/e2e/test_overlay.py Tests/e2e/test_client_example.py
    exit 0
elif [ $# -gt 0 ]; then
    echo "apple-path.sh: unknown argument '$1' (--full, or nothing)" >&2
    exit 64
fi

echo "== the target rules: roles import no role, no server-side ILSClient, ILSClient Apple-clean" >&2
./deploy/check-targets.sh

export ILS_AEAD=swift-crypto-api
echo "== the device side's Swift suites, ILS_AEAD=$ILS_AEAD" >&2
./deploy/bounded.sh 600 "swift test: records and circuits, Swift-API AEAD" swift test --skip-build \
    --filter 'ILSCryptoTests|ILSFabricTests'

bin="$(swift build --show-bin-path)"
echo "== end-to-end overlay and client tests, ILS_AEAD=$ILS_AEAD ($bin)" >&2
ILS_BIN="$bin/ils-gateway" ILS_CLIENT_EXAMPLE_BIN="$bin/ils-client-example" \
    python3 -m pytest -q Tests/e2e/test_overlay.py Tests/e2e/test_client_example.py

echo "== swift build --traits AppleCodePath --target ILSClient" >&2
swift build --traits AppleCodePath --target ILSClient
