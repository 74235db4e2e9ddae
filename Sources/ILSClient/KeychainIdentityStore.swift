#if canImport(Security)
import Foundation
public import ILSCore
import Security

/// The identity in the Keychain, as one generic password item holding the identity's JSON: readable after the
/// device's first unlock, by this app only, and never synced or restored to another device
/// (`kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly`), so the private key stays on this device.
///
/// Compiled on Apple platforms only; it has never been run by this project's tests (they run on Linux).
public struct KeychainIdentityStore: IdentityStore {
    /// `kSecAttrService` of the item.
    public let service: String
    /// `kSecAttrAccount` of the item: one identity per account.
    public let account: String

    public init(service: String = "ils-identity", account: String = "default") {
        self.service = service
        self.account = account
    }

    private var query: [String: Any] {
        [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecAttrAccount as String: account,
        ]
    }

    public func load() throws(ILSError) -> IdentityFile? {
        var search = query
        search[kSecReturnData as String] = true
        search[kSecMatchLimit as String] = kSecMatchLimitOne
        var item: CFTypeRef?
        let status = SecItemCopyMatching(search as CFDictionary, &item)
        if status == errSecItemNotFound { return nil }
        guard status == errSecSuccess, let data = item as? Data else {
            throw ILSError(.invalidInput, "the Keychain refused to read the identity (status \(status))")
        }
        guard let file = try? JSONDecoder().decode(IdentityFile.self, from: data) else {
            throw ILSError(.invalidInput, "the Keychain item \(service)/\(account) is not an identity")
        }
        return file
    }

    public func save(_ identity: IdentityFile) throws(ILSError) {
        guard let data = try? JSONEncoder().encode(identity) else {
            throw ILSError(.internalError, "could not encode the identity")
        }
        try delete()
        var item = query
        item[kSecValueData as String] = data
        item[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
        let status = SecItemAdd(item as CFDictionary, nil)
        guard status == errSecSuccess else {
            throw ILSError(.cannotWrite, "the Keychain refused to store the identity (status \(status))")
        }
    }

    public func delete() throws(ILSError) {
        let status = SecItemDelete(query as CFDictionary)
        guard status == errSecSuccess || status == errSecItemNotFound else {
            throw ILSError(.cannotWrite, "the Keychain refused to delete the identity (status \(status))")
        }
    }
}
#endif
