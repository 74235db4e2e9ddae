import Foundation
import ILSController
import Testing

@Suite("In-memory identity store")
struct InMemoryStoreTests {
    @Test("an in-memory store keeps its rows to itself and writes no file")
    func inMemoryStore() throws {
        let store = try SQLiteIdentityStore(path: SQLiteIdentityStore.inMemory)
        try store.createService(ControllerState.defaultService)
        #expect(try store.service(named: ControllerState.defaultService.name) == ControllerState.defaultService)
        let other = try SQLiteIdentityStore(path: SQLiteIdentityStore.inMemory)
        #expect(try other.service(named: ControllerState.defaultService.name) == nil)
        #expect(!FileManager.default.fileExists(atPath: SQLiteIdentityStore.inMemory))
    }
}
