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
