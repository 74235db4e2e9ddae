import Mustache

/// The pages as Mustache templates, compiled into the binary rather than read from a resource bundle: a copied
/// binary (a container image, /usr/local/bin) keeps them. `{{x}}` escapes HTML; the one `{{{body}}}` inserts a page
/// this library rendered itself, never a value from the controller or the browser.
enum ConsoleTemplates {
    static func library() throws -> MustacheLibrary {
        var library = MustacheLibrary()
        for (name, text) in all {
            try library.register(text, named: name)
        }
        return library
    }

    static let all: [(String, String)] = [
        ("layout", layout), ("message", message), ("identities", identities), ("token", token),
        ("sessions", sessions), ("services", services), ("gateways", gateways), ("audit", audit),
        ("login-link", loginLink), ("login-confirm", loginConfirm),
    ]

    static let layout = """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · ils-gateway console</title>
        <link rel="icon" href="data:,">
        <link rel="stylesheet" href="/static/console.css">
        <script src="/static/console.js" defer></script>
        </head>
        <body data-refresh="{{refresh}}">
        <header>
        <strong>ils-gateway</strong>
        {{#signedIn}}
        <nav>
        {{#nav}}<a href="{{path}}"{{#here}} class="here" aria-current="page"{{/here}}>{{label}}</a>{{/nav}}
        </nav>
        <span class="muted">as {{actor}}{{#via}} · via overlay as {{via}}{{/via}}</span>
        <form class="inline" method="post" action="/login-links"><input type="hidden" name="csrf" value="{{csrf}}"><button>Sign in another device</button></form>
        <form class="inline" method="post" action="/logout"><input type="hidden" name="csrf" value="{{csrf}}"><button>Sign out</button></form>
        {{/signedIn}}
        </header>
        <main>
        {{#error}}<p class="notice error" id="error" role="alert">{{error}}</p>{{/error}}
        {{#notice}}<p class="notice" id="notice" role="status">{{notice}}</p>{{/notice}}
        {{{body}}}
        </main>
        </body>
        </html>
        """

    static let message = """
        <h1>{{heading}}</h1>
        <p>{{text}}</p>
        """

    static let identities = """
        <h1>Identities</h1>
        <h2>Create</h2>
        <form class="stack" method="post" action="/identities" id="create-identity">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label>Name <input name="name" required maxlength="64" pattern="[A-Za-z0-9_][A-Za-z0-9._\\-]{0,63}" autocomplete="off"></label>
        <label>Role <select name="role"><option value="device">device</option><option value="gateway">gateway</option><option value="admin">admin</option></select></label>
        <label>Attributes (comma-separated, for policies) <input name="attributes" maxlength="600" placeholder="ipad, ops"></label>
        <label>Token valid for <input name="expires" value="24h" maxlength="10"></label>
        <button type="submit">Create and show QR</button>
        </form>
        <h2>All identities</h2>
        <table id="identities">
        <thead><tr><th>Name</th><th>Role</th><th>Attributes</th><th>State</th><th>Last seen</th><th>Actions</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-name="{{name}}">
        <td data-label="Name">{{name}}</td><td data-label="Role">{{role}}</td><td data-label="Attributes">{{attributes}}</td>
        <td data-label="State" class="state {{stateClass}}">{{state}}</td><td data-label="Last seen">{{lastSeen}}</td>
        <td data-label="Actions">
        {{#canRevoke}}<form class="inline" method="post" action="/identities/{{name}}/revoke" data-confirm="Revoke {{name}}? Its live streams end now and it can never connect again."><input type="hidden" name="csrf" value="{{csrf}}"><button class="danger" name="action" value="revoke">Revoke</button></form>{{/canRevoke}}
        {{#canDisable}}<form class="inline" method="post" action="/identities/{{name}}/disable" data-confirm="Disable {{name}}? Its live streams end now."><input type="hidden" name="csrf" value="{{csrf}}"><button>Disable</button></form>{{/canDisable}}
        {{#canEnable}}<form class="inline" method="post" action="/identities/{{name}}/enable"><input type="hidden" name="csrf" value="{{csrf}}"><button>Enable</button></form>{{/canEnable}}
        <form class="inline" method="post" action="/identities/{{name}}/reissue" data-confirm="Reissue a token for {{name}}? Its certificate is replaced when the token is used."><input type="hidden" name="csrf" value="{{csrf}}"><button>Reissue</button></form>
        <form class="inline" method="post" action="/identities/{{name}}/delete" data-confirm="Delete {{name}}? This cannot be undone."><input type="hidden" name="csrf" value="{{csrf}}"><button class="danger">Delete</button></form>
        </td>
        </tr>
        {{/rows}}
        </tbody>
        </table>
        """

    static let token = """
        <h1>Enroll {{name}}</h1>
        <p>Scan this code with the app on the device, or run <code>ils-gateway enroll</code> with the text below. It
        enrolls whoever uses it first, once, until {{expires}}. Close this page when done: it is not shown again.</p>
        <p><img id="enroll-qr" class="qr" alt="enrollment QR code for {{name}}" src="data:image/png;base64,{{png}}"></p>
        <details><summary>Show the enrollment URI</summary><p><code id="enroll-uri">{{uri}}</code></p></details>
        <p><a href="/identities">Back to identities</a></p>
        """

    static let sessions = """
        <h1>Live sessions</h1>
        {{#partial}}<p class="notice error" id="partial">{{.}}</p>{{/partial}}
        <p class="muted">{{count}} live circuit(s) on {{controllers}} controller(s). This page refreshes every 5 s.</p>
        <table id="sessions">
        <thead><tr><th>Device</th><th>Service</th><th>Gateway</th><th>Started</th><th>Bytes from / to device</th><th>Controller</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-device="{{device}}"><td data-label="Device">{{device}}</td><td data-label="Service">{{service}}</td><td data-label="Gateway">{{gateway}}</td>
        <td data-label="Started">{{started}}</td><td data-label="Bytes">{{fromDevice}} / {{toDevice}}</td><td data-label="Controller" class="mono">{{controller}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        """

    static let services = """
        <h1>Services</h1>
        {{#partial}}<p class="notice error">{{.}}</p>{{/partial}}
        <table id="services">
        <thead><tr><th>Name</th><th>Health</th><th>Dial</th><th>Bind</th><th>Hosted by</th><th>Change</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-name="{{name}}">
        <td data-label="Name">{{name}}</td>
        <td data-label="Health" class="{{healthClass}}">{{health}}</td>
        <td data-label="Dial"><code>{{dial}}</code></td><td data-label="Bind"><code>{{bind}}</code></td>
        <td data-label="Hosted by">{{hosts}}</td>
        <td data-label="Change">
        <details><summary>Edit</summary>
        <form class="stack" method="post" action="/services/{{name}}" id="edit-{{name}}">
        <input type="hidden" name="csrf" value="{{csrf}}"><input type="hidden" name="revision" value="{{revision}}">
        <label>Dial <select name="dialSemantic">{{#dialSemantics}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/dialSemantics}}</select></label>
        <label>Dial tokens <input name="dial" value="{{dialTokens}}" maxlength="2400"></label>
        <label>Bind <select name="bindSemantic">{{#bindSemantics}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/bindSemantics}}</select></label>
        <label>Bind tokens <input name="bind" value="{{bindTokens}}" maxlength="2400"></label>
        <button type="submit">Save</button>
        </form>
        <form class="inline" method="post" action="/services/{{name}}/delete" data-confirm="Delete {{name}}? Its live circuits end now."><input type="hidden" name="csrf" value="{{csrf}}"><button class="danger">Delete</button></form>
        </details>
        </td>
        </tr>
        {{/rows}}
        </tbody>
        </table>
        <h2>Create a service</h2>
        <form class="stack" method="post" action="/services" id="create-service">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label>Name <input name="name" required maxlength="64"></label>
        <label>Dial <select name="dialSemantic"><option>anyOf</option><option>allOf</option></select></label>
        <label>Dial tokens (role:X, #attribute, @identity, #all) <input name="dial" value="role:device" maxlength="2400"></label>
        <label>Bind <select name="bindSemantic"><option>anyOf</option><option>allOf</option></select></label>
        <label>Bind tokens <input name="bind" value="role:gateway" maxlength="2400"></label>
        <button type="submit">Create</button>
        </form>
        """

    static let gateways = """
        <h1>Gateways</h1>
        {{#partial}}<p class="notice error">{{.}}</p>{{/partial}}
        <table id="gateways">
        <thead><tr><th>Gateway</th><th>State</th><th>Health</th><th>Hosting</th><th>Last seen</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-name="{{name}}"><td data-label="Gateway">{{name}}</td><td data-label="State">{{state}}</td>
        <td data-label="Health" class="{{healthClass}}">{{health}}</td><td data-label="Hosting">{{hosting}}</td><td data-label="Last seen">{{lastSeen}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        """

    static let audit = """
        <h1>Audit log</h1>
        <form class="stack" method="get" action="/audit" id="audit-filter">
        <label>Actor <input name="actor" value="{{actor}}" maxlength="128"></label>
        <label>Action (ending in "." matches a family, e.g. identity.) <input name="action" value="{{action}}" maxlength="128"></label>
        <label>Target <input name="target" value="{{target}}" maxlength="128"></label>
        <button type="submit">Filter</button>
        </form>
        <table id="audit">
        <thead><tr><th>Time</th><th>Actor</th><th>Action</th><th>Target</th><th>Detail</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr data-seq="{{seq}}"><td data-label="Time">{{at}}</td><td data-label="Actor">{{actor}}</td><td data-label="Action">{{action}}</td>
        <td data-label="Target">{{target}}</td><td data-label="Detail">{{detail}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        <p class="pager">{{#newer}}<a href="{{.}}" id="newer">Newest</a>{{/newer}}{{#older}}<a href="{{.}}" id="older">Older entries</a>{{/older}}</p>
        """

    static let loginLink = """
        <h1>Sign in another device</h1>
        <p>Open this link on the other device, once, within 10 minutes. It opens a session of its own; this one stays
        signed in. From a phone in the overlay, open the same path at the address the phone reaches the console by.</p>
        <p><img id="login-qr" class="qr" alt="login link QR code" src="data:image/png;base64,{{png}}"></p>
        <p><code id="login-link">{{link}}</code></p>
        <p class="muted">Path: <code id="login-path">{{path}}</code></p>
        """

    static let loginConfirm = """
        <h1>Sign in to the console</h1>
        <p>This login link was opened from another page. It signs this browser in once: press the button to use it.</p>
        <form method="post" action="/login"><input type="hidden" name="t" value="{{secret}}"><button id="sign-in">Sign in</button></form>
        """
}
