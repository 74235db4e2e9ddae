#!/usr/bin/env bash
# ILSClient's Apple code path, proved on Linux (issue 24; docs/client-library.md, "What is tested where"):
#  1. ILSClient's dependency closure holds no system-library target and no unguarded Glibc/CSodium import
#     (deploy/check-client-closure.sh);
#  2. the package builds with the AppleCodePath trait, which seals end-to-end records through swift-crypto's Swift API,
#     the code CryptoKit serves on iOS, macOS and visionOS, instead of BoringSSL's in-place AEAD;
#  3. the overlay tests run with that build: the Swift suites of the device side (crypto, fabric, overlay, client),
#     then the end-to-end overlay and client tests against the binaries built that way.
# Its own build directory (.build-apple), so the default build is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ILSClient's closure: no system library, no unguarded Glibc or CSodium" >&2
./deploy/check-client-closure.sh

scratch=.build-apple
echo "== swift build --traits AppleCodePath (into $scratch)" >&2
swift build --build-tests --traits AppleCodePath --scratch-path "$scratch"

echo "== the device side's Swift suites, AppleCodePath build" >&2
swift test --skip-build --traits AppleCodePath --scratch-path "$scratch" \
    --filter 'ILSCryptoTests|ILSFabricTests|ILSOverlayTests|ILSClientTests|ILSTunnelTests'

bin="$(swift build --traits AppleCodePath --scratch-path "$scratch" --show-bin-path)"
echo "== end-to-end overlay and client tests, AppleCodePath binaries ($bin)" >&2
ILS_BIN="$bin/ils-gateway" python3 -m pytest -q Tests/e2e/test_overlay.py Tests/e2e/test_client_example.py
