import Foundation
import ILSController
import ILSStore
import Testing

@Suite("In-memory identity store")
struct InMemoryStoreTests {
    @Test("an in-memory store keeps its rows to itself and writes no file")
    func inMemoryStore() async throws {
        let store = try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        try await store.createService(ControllerState.defaultService)
        #expect(try await store.service(named: ControllerState.defaultService.name) == ControllerState.defaultService)
        let other = try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        #expect(try await other.service(named: ControllerState.defaultService.name) == nil)
        #expect(!FileManager.default.fileExists(atPath: SQLiteControllerStore.inMemory))
    }
}
