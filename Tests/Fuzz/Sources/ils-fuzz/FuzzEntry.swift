import Foundation
import ILSFuzz

/// The target this process fuzzes, named by `ILS_FUZZ_TARGET`; read once, on the first input.
let selectedTarget: FuzzTargets.Entry = {
    let name = ProcessInfo.processInfo.environment["ILS_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTargets.all.first(where: { $0.name == name }) else {
        let names = FuzzTargets.all.map(\.name).joined(separator: ", ")
        FileHandle.standardError.write(Data("set ILS_FUZZ_TARGET to one of: \(names)\n".utf8))
        exit(2)
    }
    return target.entry
}()

/// libFuzzer's entry (https://llvm.org/docs/LibFuzzer.html#fuzz-target): one input, always 0.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    selectedTarget(UnsafeRawBufferPointer(start: start, count: count))
    return 0
}

/// libFuzzer's driver, the `main` it would otherwise bring along.
@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

/// SwiftPM links an executable's `main` to `<product>_main` (so its tests can link it); this is that entry, and it
/// hands the process to libFuzzer's driver.
@_cdecl("ils_fuzz_main")
public func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return runFuzzerDriver(&argc, &argv) { start, count in fuzzOneInput(start, count) }
}
