# The sanitizer environment of a test run, shared by deploy/sanitize.sh and deploy/flake-hunt.sh. Source it from the
# repository root, then:
#
#   sanitizer_env KIND SCRATCH     KIND: address or thread; SCRATCH: that sanitizer's build directory (.build-asan)
#   sanitizer_clear_reports        empties the report directory again (flake-hunt.sh, between runs)
#
# sanitizer_env sets sanitizer_reports to SCRATCH/reports (an absolute path), empties that directory, and exports the
# options that send every report there, from the test runner or from any child process, plus the tests' time scale.
# shellcheck shell=bash

sanitizer_env() {
    local kind=$1 scratch=$2 default_scale
    sanitizer_reports="$(realpath -m "$scratch")/reports"
    sanitizer_clear_reports

    # log_path sends every report to a file named after the process, so a child that dies of a report is never missed.
    # Leak suppressions (deploy/sanitizers/lsan.supp) cover XCTest's runner and swift-nio's perpetual global thread pool only.
    export LSAN_OPTIONS="suppressions=$PWD/deploy/sanitizers/lsan.supp:print_suppressions=0"
    export ASAN_OPTIONS="log_path=$sanitizer_reports/asan:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
    export TSAN_OPTIONS="log_path=$sanitizer_reports/tsan:halt_on_error=0:second_deadlock_stack=1"

    # Sanitized code runs several times slower: the tests' own deadlines stretch by this factor (Sources/ILSTesting/TestTiming.swift).
    if [ "$kind" = thread ]; then default_scale=10; else default_scale=4; fi
    export ILS_TEST_TIME_SCALE="${ILS_TEST_TIME_SCALE:-$default_scale}"
}

sanitizer_clear_reports() {
    rm -rf "$sanitizer_reports"
    mkdir -p "$sanitizer_reports"
}
