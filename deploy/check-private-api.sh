#!/usr/bin/env bash
# Fails when the project leans on swift-crypto's internals anywhere but the one documented exception
# (docs/design/private-api.md):
#   (a) a Swift source under Sources/ or Tests/ imports CCryptoBoringSSL, CCryptoBoringSSLShims or CryptoBoringWrapper
#       (any access level or attribute) other than Sources/ILSCrypto/AESGCMInPlace.swift;
#   (b) Package.swift does not pin swift-crypto to `.upToNextMinor(from: "4.5.x")`, the range whose BoringSSL AEAD
#       symbols AESGCMInPlace.swift was written and tested against;
#   (c) a Package.resolved exists and resolves swift-crypto outside 4.5.x.
# The swift suite's AEADPathTests complete the guard: they fail a Linux build in which the in-place path silently
# went away (a renamed module makes its `canImport` false).
# Each finding is printed as PATH:LINE or a sentence; exit status 1.
#
# Usage: deploy/check-private-api.sh [--package DIR]
set -euo pipefail

package="$(cd "$(dirname "$0")/.." && pwd)"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --package) package="$(cd "$2" && pwd)"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "check-private-api: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
cd "$package"

exception="Sources/ILSCrypto/AESGCMInPlace.swift"
pin_minor="4.5"
failed=0

# (a) Every Swift file of the project, tracked or not, but never a build directory or a dependency's checkout.
while IFS= read -r -d '' file; do
    file="${file#./}"
    [[ "$file" == "$exception" ]] && continue
    if hits="$(grep -nE '^[[:space:]]*(@[A-Za-z_]+[[:space:]]+)*((public|package|internal|fileprivate|private)[[:space:]]+)?import[[:space:]]+(CCryptoBoringSSL|CCryptoBoringSSLShims|CryptoBoringWrapper)([[:space:]]|$)' "$file")"; then
        while IFS= read -r hit; do
            echo "$file:${hit%%:*}: imports swift-crypto's internal module outside $exception" >&2
        done <<< "$hits"
        failed=1
    fi
done < <(find ./Sources ./Tests -name '*.swift' -not -path '*/.build*' -print0 2>/dev/null)

# (b) The pin in Package.swift.
if ! grep -qE "\.package\(url: \"https://github\.com/apple/swift-crypto\.git\", \.upToNextMinor\(from: \"${pin_minor//./\\.}\.[0-9]+\"\)\)" Package.swift; then
    echo "Package.swift: swift-crypto must be pinned as .upToNextMinor(from: \"$pin_minor.x\") while $exception exists" >&2
    failed=1
fi

# (c) What was resolved, when something was.
if [[ -f Package.resolved ]]; then
    resolved="$(python3 -c '
import json, sys
pins = json.load(open("Package.resolved")).get("pins", [])
print(next((p["state"].get("version", "") for p in pins if p.get("identity") == "swift-crypto"), ""))
')"
    if [[ -n "$resolved" && "$resolved" != "$pin_minor".* ]]; then
        echo "Package.resolved: swift-crypto $resolved is outside $pin_minor.x, which $exception was tested against" >&2
        failed=1
    fi
fi

if ((failed)); then exit 1; fi
echo "check-private-api: swift-crypto's internals are imported only in $exception; swift-crypto pinned to $pin_minor.x"
