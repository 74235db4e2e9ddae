#!/usr/bin/env bash
# ILSClient's Apple code path, proved on Linux (issue 24; docs/client-library.md, "What is tested where"; issue 36
# made it one build of ILSClient's closure instead of a second build of the whole package):
#  1. ILSClient's dependency closure holds no system-library target and no unguarded Glibc/CSodium import
#     (deploy/check-client-closure.sh);
#  2. ILSClient and its closure build with the AppleCodePath trait, which leaves out BoringSSL's in-place AEAD and
#     seals end-to-end records through swift-crypto's Swift API, the code CryptoKit serves on iOS, macOS and visionOS;
#  3. the device side's tests run on that code: the Swift suites (crypto, fabric, overlay, client, tunnel), then the
#     end-to-end overlay and client tests, with ILS_AEAD=swift-crypto-api, which selects the same Swift-API path at
#     run time in the ordinary build (Sources/ILSCrypto/E2ERecords.swift; AEADPathTests fails if it does not).
# Needs the ordinary build (deploy/test.sh, or swift build --build-tests). The trait build has its own directory
# (.build-apple), so the ordinary build is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ILSClient's closure: no system library, no unguarded Glibc or CSodium" >&2
./deploy/check-client-closure.sh

scratch=.build-apple
echo "== swift build --traits AppleCodePath --product ILSClient (into $scratch)" >&2
swift build --traits AppleCodePath --scratch-path "$scratch" --product ILSClient

export ILS_AEAD=swift-crypto-api
echo "== the device side's Swift suites, ILS_AEAD=$ILS_AEAD" >&2
./deploy/bounded.sh 600 "swift test: device side, Swift-API AEAD" swift test --skip-build \
    --filter 'ILSCryptoTests|ILSFabricTests|ILSOverlayTests|ILSClientTests|ILSTunnelTests'

bin="$(swift build --show-bin-path)"
echo "== end-to-end overlay and client tests, ILS_AEAD=$ILS_AEAD ($bin)" >&2
ILS_BIN="$bin/ils-gateway" ILS_CLIENT_EXAMPLE_BIN="$bin/ils-client-example" \
    python3 -m pytest -q Tests/e2e/test_overlay.py Tests/e2e/test_client_example.py
