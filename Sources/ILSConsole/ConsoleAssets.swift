/// The console's stylesheet and script, served from `/static/`. Nothing is fetched from anywhere else: the
/// Content-Security-Policy allows only this origin (and `data:` images for QR codes).
enum ConsoleAssets {
    /// Phone first: one column, and tables turn into labelled cards under 600 px, so nothing scrolls sideways.
    static let css = """
        :root { color-scheme: light dark; --accent: #2f6fdb; --bad: #c0392b; --ok: #1e8449; --line: #8884; }
        * { box-sizing: border-box; }
        body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; }
        header { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1rem; padding: .6rem 1rem;
          border-bottom: 1px solid var(--line); }
        header strong { margin-right: auto; }
        nav { display: flex; flex-wrap: wrap; gap: .25rem .9rem; }
        nav a { text-decoration: none; color: var(--accent); }
        nav a.here { font-weight: 600; text-decoration: underline; }
        main { padding: 1rem; max-width: 72rem; margin: 0 auto; }
        h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
        h2 { font-size: 1.1rem; margin: 1.5rem 0 .6rem; }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top;
          overflow-wrap: anywhere; }
        form.inline { display: inline; }
        form.stack { display: grid; gap: .5rem; max-width: 32rem; }
        label { display: grid; gap: .15rem; }
        input, select, button { font: inherit; padding: .35rem .5rem; max-width: 100%; }
        button { cursor: pointer; border: 1px solid var(--line); border-radius: .3rem; background: transparent; }
        button.danger { color: var(--bad); border-color: var(--bad); }
        .notice { padding: .6rem .8rem; border-radius: .3rem; margin: 0 0 1rem; border: 1px solid var(--line); }
        .error { border-color: var(--bad); color: var(--bad); }
        .ok { color: var(--ok); }
        .bad { color: var(--bad); }
        .muted { opacity: .7; }
        code, .mono { font-family: ui-monospace, "SF Mono", Menlo, monospace; font-size: .9em; overflow-wrap: anywhere; }
        img.qr { width: min(100%, 22rem); height: auto; image-rendering: pixelated; background: #fff; }
        .pager { margin-top: 1rem; display: flex; gap: 1rem; }
        @media (max-width: 600px) {
          table, thead, tbody, tr, th, td { display: block; }
          thead { display: none; }
          tr { border: 1px solid var(--line); border-radius: .3rem; margin-bottom: .6rem; padding: .2rem 0; }
          td { border: 0; padding: .2rem .6rem; }
          td[data-label]::before { content: attr(data-label) ": "; font-weight: 600; }
        }
        """

    /// A confirmation before a change that cuts a device off, and a refresh of pages that show live state.
    static let javaScript = """
        "use strict";
        // A login link opened from another site shows a button (login-confirm): the secret leaves the address bar
        // and the history entry at once, and lives on in the form only.
        if (document.getElementById("sign-in")) { history.replaceState(null, "", "/login"); }
        document.addEventListener("submit", (event) => {
          const question = event.target.getAttribute("data-confirm");
          if (question && !window.confirm(question)) { event.preventDefault(); }
        });
        const every = Number(document.body.getAttribute("data-refresh") || "0");
        if (every > 0) {
          // auto=1 tells the console this load is not the admin's: it does not extend the session's idle timeout.
          setTimeout(() => {
            if (document.querySelector("form :focus")) { return; }
            const next = new URL(location.href);
            next.searchParams.set("auto", "1");
            location.replace(next);
          }, every * 1000);
        }
        """
}
