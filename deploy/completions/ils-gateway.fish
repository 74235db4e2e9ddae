function __ils-gateway_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __ils-gateway_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __ils-gateway_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __ils-gateway_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __ils-gateway_parse_tokens -S
    set -l unparsed_tokens (__ils-gateway_tokens -pc)
    switch $unparsed_tokens[1]
    case 'ils-gateway'
        __ils-gateway_parse_subcommand 0 'version' 'h/help'
        switch $unparsed_tokens[1]
        case 'controller'
            __ils-gateway_parse_subcommand 0 'version' 'h/help'
            switch $unparsed_tokens[1]
            case 'init'
                __ils-gateway_parse_subcommand 0 'state-dir=' 'store=' 'address=' 'admin-out=' 'version' 'h/help'
            case 'join'
                __ils-gateway_parse_subcommand 0 'state-dir=' 'store=' 'identity=' 'address=' 'version' 'h/help'
            case 'run'
                __ils-gateway_parse_subcommand 0 'state-dir=' 'store=' 'listen=' 'max-connections=' 'max-connections-per-source=' 'request-head-timeout=' 'request-body-timeout=' 'max-circuits-per-identity=' 'circuit-opens-per-second=' 'config=' 'log-level=' 'log-format=' 'metrics=' 'metrics-allow-remote' 'no-metrics-allow-remote' 'audit-retention=' 'audit-max-rows=' 'keepalive=' 'keepalive-timeout=' 'version' 'h/help'
            case 'migrate'
                __ils-gateway_parse_subcommand 0 'from=' 'to=' 'version' 'h/help'
            case 'rotate-tls'
                __ils-gateway_parse_subcommand 0 'state-dir=' 'store=' 'address=' 'version' 'h/help'
            end
        case 'admin'
            __ils-gateway_parse_subcommand 0 'identity=' 'version' 'h/help'
            switch $unparsed_tokens[1]
            case 'identity'
                __ils-gateway_parse_subcommand 0 'version' 'h/help'
                switch $unparsed_tokens[1]
                case 'create'
                    __ils-gateway_parse_subcommand 1 'identity=' 'role=' 'attributes=' 'expires=' 'o/output=' 'qr' 'qr-png=' 'version' 'h/help'
                case 'list'
                    __ils-gateway_parse_subcommand 0 'identity=' 'json' 'version' 'h/help'
                case 'show'
                    __ils-gateway_parse_subcommand 1 'identity=' 'json' 'version' 'h/help'
                case 'update'
                    __ils-gateway_parse_subcommand 1 'identity=' 'attributes=' 'version' 'h/help'
                case 'revoke'
                    __ils-gateway_parse_subcommand 1 'identity=' 'version' 'h/help'
                case 'disable'
                    __ils-gateway_parse_subcommand 1 'identity=' 'version' 'h/help'
                case 'enable'
                    __ils-gateway_parse_subcommand 1 'identity=' 'version' 'h/help'
                case 'delete'
                    __ils-gateway_parse_subcommand 1 'identity=' 'version' 'h/help'
                case 'reissue'
                    __ils-gateway_parse_subcommand 1 'identity=' 'expires=' 'o/output=' 'qr' 'qr-png=' 'version' 'h/help'
                end
            case 'service'
                __ils-gateway_parse_subcommand 0 'version' 'h/help'
                switch $unparsed_tokens[1]
                case 'create'
                    __ils-gateway_parse_subcommand 1 'identity=' 'dial=' 'dial-semantic=' 'bind=' 'bind-semantic=' 'version' 'h/help'
                case 'list'
                    __ils-gateway_parse_subcommand 0 'identity=' 'json' 'version' 'h/help'
                case 'show'
                    __ils-gateway_parse_subcommand 1 'identity=' 'json' 'version' 'h/help'
                case 'update'
                    __ils-gateway_parse_subcommand 1 'identity=' 'dial=' 'dial-semantic=' 'bind=' 'bind-semantic=' 'version' 'h/help'
                case 'delete'
                    __ils-gateway_parse_subcommand 1 'identity=' 'version' 'h/help'
                end
            case 'sessions'
                __ils-gateway_parse_subcommand 0 'identity=' 'json' 'version' 'h/help'
            case 'audit'
                __ils-gateway_parse_subcommand 0 'identity=' 'since=' 'before=' 'limit=' 'actor=' 'action=' 'target=' 'json' 'version' 'h/help'
            case 'console'
                __ils-gateway_parse_subcommand 0 'identity=' 'listen=' 'tls-cert=' 'tls-key=' 'allowed-host=+' 'max-connections=' 'max-connections-per-source=' 'request-head-timeout=' 'request-body-timeout=' 'log-level=' 'log-format=' 'version' 'h/help'
            end
        case 'enroll'
            __ils-gateway_parse_subcommand 1 'out=' 'force' 'pem' 'version' 'h/help'
        case 'serve'
            __ils-gateway_parse_subcommand 0 'mode=' 'identity=' 'service=' 'client-auth=' 'policy-grace=' 'hsts-max-age=' 'backend=' 'listen=' 'tls-cert=' 'tls-key=' 'plain-http' 'no-plain-http' 'backend-header-timeout=' 'backend-connect-timeout=' 'backend-max-connections=' 'idle-timeout=' 'client-stall-timeout=' 'drain-timeout=' 'max-connections=' 'max-connections-per-source=' 'keepalive=' 'keepalive-timeout=' 'resume-grace=' 'resume-buffer=' 'resume-per-identity=' 'resume-total=' 'resume-held-per-identity=' 'config=' 'log-level=' 'log-format=' 'metrics=' 'metrics-allow-remote' 'no-metrics-allow-remote' 'version' 'h/help'
        case 'tunnel'
            __ils-gateway_parse_subcommand 0 'identity=' 'service=' 'listen=' 'allow-remote' 'no-allow-remote' 'allowed-host=+' 'allow-origin=+' 'resume-grace=' 'idle-timeout=' 'keepalive=' 'keepalive-timeout=' 'config=' 'log-level=' 'log-format=' 'metrics=' 'metrics-allow-remote' 'no-metrics-allow-remote' 'version' 'h/help'
        case 'status'
            __ils-gateway_parse_subcommand 0 'identity=' 'json' 'version' 'h/help'
        case 'renew'
            __ils-gateway_parse_subcommand 0 'identity=' 'force' 'version' 'h/help'
        case 'help'
            __ils-gateway_parse_subcommand -r 1 'version'
        end
    end
end

function __ils-gateway_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __ils-gateway_parse_subcommand -S -a positional_count
    argparse -s r -- $argv
    set -l option_specs $argv[2..]
    set -l is_repeating_positional $_flag_r
    set -el _flag_r
    set -a commands $unparsed_tokens[1]
    set positional_index 0
    while true
        set -e unparsed_tokens[1]
        argparse -sn "$commands" $option_specs -- $unparsed_tokens 2> /dev/null
        set unparsed_tokens $argv
        set positional_index (math $positional_index + 1)
        for non_repeating_flag_or_option in $non_repeating_flags_or_options
            if set -ql "_flag_$(string replace -a - _ -- $non_repeating_flag_or_option)"
                set non_repeating_flags_or_options_absent 1
                break
            end
        end
        test (count $unparsed_tokens) -eq 0 -o \( -z "$is_repeating_positional" -a "$positional_index" -gt "$positional_count" \) && break
    end
end

function __ils-gateway_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __ils-gateway_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__ils-gateway_tokens -p)
    if test -z "$(__ils-gateway_tokens -t)"
        set -l index (count (__ils-gateway_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'ils-gateway' -f
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'controller' -d 'Create and run the overlay controller (CA, identity store, enrollment, admin API).'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'admin' -d 'Administer identities and services through the controller\'s admin API.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'enroll' -d 'Enroll this machine: make its key pair and turn a one-time token into an identity file.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'serve' -d 'Run the gateway in front of the backend.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'tunnel' -d 'Listen on loopback and carry every connection to a service through the overlay.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'status' -d 'Show this identity, its certificate expiry, and whether the controller is reachable and accepts it.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'renew' -d 'Renew this identity\'s certificate with a new key, without a token (serve and tunnel do it on start).'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway" -eq 1' -fa 'help' -d 'Show subcommand help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway controller" -eq 1' -fa 'init' -d 'Create a controller: CA, TLS certificate, token key, store, the claude-api service, an admin.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway controller" -eq 1' -fa 'join' -d 'Make a new controller replica: copy the cluster\'s CA and token key from a running controller.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway controller" -eq 1' -fa 'run' -d 'Serve enrollment and the admin API on the controller\'s one TLS port.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway controller" -eq 1' -fa 'migrate' -d 'Copy a controller\'s store into an empty one: SQLite to PostgreSQL, before adding replicas.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway controller" -eq 1' -fa 'rotate-tls' -d 'Give the controller a fresh TLS certificate from its CA, for its address or a new one.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" state-dir' -l 'state-dir' -d 'Controller state directory (CA, keys, SQLite store). Env: ILS_STATE_DIR.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" store' -l 'store' -d 'The store: a SQLite file (default: DIR/store.sqlite) or a PostgreSQL URL that several controllers share, postgres://USER@HOST:PORT/DB?sslmode=verify-full (the password may come from PGPASSWORD). Env: ILS_STORE.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" address' -l 'address' -d 'The URL devices and gateways will dial, https://HOST:PORT. It goes into every token.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" admin-out' -l 'admin-out' -d 'Where to write the admin identity file.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller init" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" state-dir' -l 'state-dir' -d 'Controller state directory (CA, keys, SQLite store). Env: ILS_STATE_DIR.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" store' -l 'store' -d 'The store: a SQLite file (default: DIR/store.sqlite) or a PostgreSQL URL that several controllers share, postgres://USER@HOST:PORT/DB?sslmode=verify-full (the password may come from PGPASSWORD). Env: ILS_STORE.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" identity' -l 'identity' -d 'An admin identity file; its controller is the one the secrets are copied from.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" address' -l 'address' -d 'The URL devices and gateways will dial for this replica, https://HOST:PORT.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller join" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" state-dir' -l 'state-dir' -d 'Controller state directory (CA, keys, SQLite store). Env: ILS_STATE_DIR.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" store' -l 'store' -d 'The store: a SQLite file (default: DIR/store.sqlite) or a PostgreSQL URL that several controllers share, postgres://USER@HOST:PORT/DB?sslmode=verify-full (the password may come from PGPASSWORD). Env: ILS_STORE.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" listen' -l 'listen' -d 'HOST:PORT to listen on. Env: ILS_LISTEN. Default: 0.0.0.0 and the controller address\'s port.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" max-connections' -l 'max-connections' -d 'Most connections open at once on the port (API calls, devices, and each gateway\'s one link per controller event loop); beyond it a new connection is closed as it is accepted, before TLS, and counted in ils_connections_refused_total. Default: 4096.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" max-connections-per-source' -l 'max-connections-per-source' -d 'Most connections open at once from one IP address (a gateway host holds one per controller event loop per gateway; devices behind one NAT share an address). Refused like --max-connections, logged once per address per minute. Default: 256.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" request-head-timeout' -l 'request-head-timeout' -d 'An API request\'s head must be complete this long after its first byte (the first request\'s: after the TLS handshake), however slowly it trickles; then 408 and close. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" request-body-timeout' -l 'request-body-timeout' -d 'An API request\'s body must be complete this long after its head; then 408 and close. Default: 20s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" max-circuits-per-identity' -l 'max-circuits-per-identity' -d 'Most circuits one identity may hold open at once through this controller (all its connections together; devices are also told it as their HTTP/2 stream limit). Beyond it a circuit is answered 429 circuit_limit, counted in ils_refusals_total{reason} and logged once per identity per minute. Default: 256.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" circuit-opens-per-second' -l 'circuit-opens-per-second' -d 'Most new circuits one identity may open per second through this controller, sustained (twice as many at once after a quiet spell); beyond it 429 circuit_rate. Default: 200.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" config' -l 'config' -d 'YAML file of settings named like the long flags (examples in deploy/config/); flags and environment variables win over it. Env: ILS_CONFIG.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" log-level' -l 'log-level' -d 'Least severe level logged: trace, debug, info, notice, warning, error or critical. Default: info.' -rfka 'trace debug info notice warning error critical'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" log-format' -l 'log-format' -d 'text for people, json for log collectors (one object per line). Default: text.' -rfka 'text json'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" metrics' -l 'metrics' -d 'Serve Prometheus metrics, /healthz and /readyz on HOST:PORT (loopback only by default). Env: ILS_METRICS.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" metrics-allow-remote' -l 'metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" no-metrics-allow-remote' -l 'no-metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" audit-retention' -l 'audit-retention' -d 'Delete audit entries older than this, e.g. 30d, 90d. Default: 90d.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" audit-max-rows' -l 'audit-max-rows' -d 'Keep at most this many audit entries (the oldest go first). Default: 1000000.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" keepalive' -l 'keepalive' -d 'Overlay connections: after this long with nothing received, send an HTTP/2 PING, so a link that a NAT or firewall dropped without a word is noticed (and the idle mapping is kept alive). Default: 25s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" keepalive-timeout' -l 'keepalive-timeout' -d 'Overlay connections: close a connection (and redial, or stop routing to it) when nothing at all arrives within this long after its PING. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller run" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller migrate" from' -l 'from' -d 'The store to copy: a SQLite file (or a postgres:// URL).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller migrate" to' -l 'to' -d 'The empty store to copy into: a postgres:// URL (the password may come from PGPASSWORD).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller migrate" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller migrate" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller rotate-tls" state-dir' -l 'state-dir' -d 'Controller state directory (CA, keys, SQLite store). Env: ILS_STATE_DIR.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller rotate-tls" store' -l 'store' -d 'The store: a SQLite file (default: DIR/store.sqlite) or a PostgreSQL URL that several controllers share, postgres://USER@HOST:PORT/DB?sslmode=verify-full (the password may come from PGPASSWORD). Env: ILS_STORE.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller rotate-tls" address' -l 'address' -d 'Move the controller to this URL, https://HOST:PORT. Default: keep its address.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller rotate-tls" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway controller rotate-tls" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin" identity' -l 'identity' -d 'The admin identity file.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin" -eq 1' -fa 'identity' -d 'Create, list, show, delete and reissue identities.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin" -eq 1' -fa 'service' -d 'Create, list, show, update and delete services and who may dial and host them.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin" -eq 1' -fa 'sessions' -d 'List live circuits on every controller: device, service, gateway, controller, start, bytes.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin" -eq 1' -fa 'audit' -d 'Show the audit log: admin actions, enrollments and refusals, with time and actor.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin" -eq 1' -fa 'console' -d 'Run the admin console in a browser: identities with QR enrollment, sessions, services, audit.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'create' -d 'Create an identity and print its one-time enrollment token.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'list' -d 'List identities with role and state.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'show' -d 'Show one identity.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'update' -d 'Replace an identity\'s attributes; circuits its new attributes no longer allow end now.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'revoke' -d 'Revoke an identity for good: its live circuits end now, everywhere, and it never gets back in.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'disable' -d 'Block an identity for now (e.g. a device left somewhere); its live circuits end. Undo with enable.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'enable' -d 'Let a disabled identity back in.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'delete' -d 'Delete an identity; its certificate stops being accepted.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin identity" -eq 1' -fa 'reissue' -d 'Issue a fresh enrollment token; once it is used, the previous certificate stops working.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" role' -l 'role' -d 'device (dials services), gateway (hosts them) or admin.' -rfka 'device gateway admin'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" attributes' -l 'attributes' -d 'Comma-separated attributes for policies.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" expires' -l 'expires' -d 'How long the enrollment token stays valid, e.g. 30m, 24h, 7d.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" o output' -l 'output' -s 'o' -d 'Write the token to this file (mode 0600) instead of printing it.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" qr' -l 'qr' -d 'Also print the token as a QR code (drawn for a dark terminal) and as the URI it carries, ils-enroll://v1/<token>, for the app\'s camera or `ils-gateway enroll <uri>`.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" qr-png' -l 'qr-png' -d 'Also write the QR code as a PNG image to this file (mode 0600: whoever holds it can enroll).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity create" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity list" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity list" json' -l 'json' -d 'Print JSON.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity list" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity list" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity show" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity show" json' -l 'json' -d 'Print JSON.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity show" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity show" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity update" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity update" attributes' -l 'attributes' -d 'The new comma-separated attributes (at most 32; \'\' for none).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity update" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity update" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity revoke" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity revoke" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity revoke" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity disable" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity disable" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity disable" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity enable" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity enable" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity enable" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity delete" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity delete" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity delete" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" expires' -l 'expires' -d 'How long the enrollment token stays valid, e.g. 30m, 24h, 7d.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" o output' -l 'output' -s 'o' -d 'Write the token to this file (mode 0600) instead of printing it.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" qr' -l 'qr' -d 'Also print the token as a QR code (drawn for a dark terminal) and as the URI it carries, ils-enroll://v1/<token>, for the app\'s camera or `ils-gateway enroll <uri>`.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" qr-png' -l 'qr-png' -d 'Also write the QR code as a PNG image to this file (mode 0600: whoever holds it can enroll).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin identity reissue" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin service" -eq 1' -fa 'create' -d 'Create a service (default policies: devices dial, gateways host).'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin service" -eq 1' -fa 'list' -d 'List services with their policies and the gateways hosting them on every controller.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin service" -eq 1' -fa 'show' -d 'Show a service: policies, revision, who may dial it now, and its gateways on every controller.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin service" -eq 1' -fa 'update' -d 'Change a service\'s policies; live circuits they no longer allow end before this returns.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_positional "ils-gateway admin service" -eq 1' -fa 'delete' -d 'Delete a service: its circuits end and its gateways are disconnected now.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" dial' -l 'dial' -d 'Who may dial: comma-separated tokens, e.g. \'role:device,#ipad\' (\'\' allows nobody).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" dial-semantic' -l 'dial-semantic' -d 'anyOf (a dialer matches one token) or allOf (every token).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" bind' -l 'bind' -d 'Which gateways may host: comma-separated tokens, e.g. \'role:gateway\' or \'@gw-home\'.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" bind-semantic' -l 'bind-semantic' -d 'anyOf or allOf, for --bind.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service create" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service list" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service list" json' -l 'json' -d 'Print JSON.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service list" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service list" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service show" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service show" json' -l 'json' -d 'Print JSON.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service show" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service show" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" dial' -l 'dial' -d 'Who may dial: comma-separated tokens, e.g. \'role:device,#ipad\' (\'\' allows nobody).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" dial-semantic' -l 'dial-semantic' -d 'anyOf (a dialer matches one token) or allOf (every token).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" bind' -l 'bind' -d 'Which gateways may host: comma-separated tokens, e.g. \'role:gateway\' or \'@gw-home\'.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" bind-semantic' -l 'bind-semantic' -d 'anyOf or allOf, for --bind.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service update" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service delete" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service delete" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin service delete" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin sessions" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin sessions" json' -l 'json' -d 'Print JSON: every session, each with the controller that relays it.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin sessions" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin sessions" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" since' -l 'since' -d 'Only entries newer than this, e.g. 15m, 24h, 7d.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" before' -l 'before' -d 'Only entries older than this sequence number (the next page). Default: the newest.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" limit' -l 'limit' -d 'At most this many entries, 1-1000. Default: 100.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" actor' -l 'actor' -d 'Only entries by this actor (an identity name, or \'controller\').' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" action' -l 'action' -d 'Only entries with this action, e.g. identity.revoke; one ending in \'.\' matches every action it starts.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" target' -l 'target' -d 'Only entries about this target (an identity, service or address).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" json' -l 'json' -d 'Print JSON: an array of entries, each with seq, at, actor, action, target and detail.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin audit" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" identity' -l 'identity' -d 'The admin identity file (also accepted before the verb).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" listen' -l 'listen' -d 'Where to listen, HOST:PORT (port 0 picks a free one).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" tls-cert' -l 'tls-cert' -d 'PEM certificate chain to serve HTTPS with (needed beyond loopback).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" tls-key' -l 'tls-key' -d 'PEM private key of --tls-cert.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console"' -l 'allowed-host' -d 'A Host name the console answers to besides loopback ones, e.g. the service name it is hosted as in the overlay. Repeat for several. Any other Host gets 421 (this is what stops DNS rebinding).' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" max-connections' -l 'max-connections' -d 'Most connections open at once; beyond it a new connection is closed as it is accepted, before TLS. Default: 64.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" max-connections-per-source' -l 'max-connections-per-source' -d 'Most connections open at once from one IP address (a browser opens about 6). Default: 16.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" request-head-timeout' -l 'request-head-timeout' -d 'A connection\'s first request head must be complete this long after it is accepted (TLS handshake included), however slowly it trickles; a later request\'s within 30 s of the last answer. Then the connection is closed. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" request-body-timeout' -l 'request-body-timeout' -d 'A request\'s body must be complete this long after its head; then the connection is closed. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" log-level' -l 'log-level' -d 'Least severe level logged: trace, debug, info, notice, warning, error or critical. Default: info.' -rfka 'trace debug info notice warning error critical'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" log-format' -l 'log-format' -d 'text for people, json for log collectors (one object per line). Default: text.' -rfka 'text json'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway admin console" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway enroll" out' -l 'out' -d 'Where to write the identity file. Default: identities/NAME.json.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway enroll" force' -l 'force' -d 'Replace an existing identity file (and PEM files with --pem).'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway enroll" pem' -l 'pem' -d 'Also write NAME.cert.pem, NAME.key.pem and NAME.ca.pem next to the identity file (mode 0600), for curl             and other clients of HTTP mode with client certificates.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway enroll" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway enroll" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" mode' -l 'mode' -d 'ziti (overlay, no listening port) or http (TLS reverse proxy). Env: NETWORKING_MODE.' -rfka 'ziti http'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" identity' -l 'identity' -d 'The gateway\'s identity file. Env: ILS_IDENTITY. Overlay mode: default identities/gateway.json. HTTP mode: with one, clients need a certificate of an active device identity from its controller.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" service' -l 'service' -d 'The service to host (HTTP mode: whose dial policy applies). Env: ILS_SERVICE. Default: claude-api.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" client-auth' -l 'client-auth' -d 'HTTP mode with --identity: \'required\' (client certificates of active devices; the default) or \'none\' (anyone who reaches the port). Env: ILS_CLIENT_AUTH.' -rfka 'required none'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" policy-grace' -l 'policy-grace' -d 'HTTP mode: how long the last policy holds while the controller is unreachable. Default: 60s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" hsts-max-age' -l 'hsts-max-age' -d 'HTTP mode over TLS: send Strict-Transport-Security with this max-age (e.g. 365d). Default: off.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" backend' -l 'backend' -d 'Backend base URL, http://HOST[:PORT]. Env: BACKEND_URL. Default: http://127.0.0.1:8000.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" listen' -l 'listen' -d 'HTTP mode: address to listen on, HOST:PORT. Env: ILS_LISTEN. Default: 0.0.0.0:8443.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" tls-cert' -l 'tls-cert' -d 'HTTP mode: PEM certificate chain for TLS. Env: ILS_TLS_CERT.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" tls-key' -l 'tls-key' -d 'HTTP mode: PEM private key for TLS. Env: ILS_TLS_KEY.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" plain-http' -l 'plain-http' -d 'HTTP mode: serve cleartext HTTP instead of TLS. Only for a trusted network or loopback. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" no-plain-http' -l 'no-plain-http' -d 'HTTP mode: serve cleartext HTTP instead of TLS. Only for a trusted network or loopback. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" backend-header-timeout' -l 'backend-header-timeout' -d 'How long the backend may take to send response headers. Streams are never cut. Default: 300s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" backend-connect-timeout' -l 'backend-connect-timeout' -d 'How long connecting to the backend may take. Default: 5s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" backend-max-connections' -l 'backend-max-connections' -d 'Most connections open to the backend at once. Default: 16384.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" idle-timeout' -l 'idle-timeout' -d 'How long a client connection may stay open with no request in progress (also bounds slow headers). Default: 60s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" client-stall-timeout' -l 'client-stall-timeout' -d 'How long a client may take nothing of a response before the exchange is given up with its backend request. Overlay mode: a device that acknowledges nothing of a circuit\'s answer (reads nothing, on a circuit that cannot resume). Default: 60s in overlay mode, the grace window\'s length (a device that is there but takes nothing gets no longer than one that is gone); 600s in HTTP mode.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" drain-timeout' -l 'drain-timeout' -d 'On SIGTERM/SIGINT, how long in-flight requests may continue before they are closed. Default: 30s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" max-connections' -l 'max-connections' -d 'HTTP mode: most client connections open at once; beyond it a new connection is closed as it is accepted, before TLS, and counted in ils_connections_refused_total. Default: 16384.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" max-connections-per-source' -l 'max-connections-per-source' -d 'HTTP mode: most connections open at once from one client IP address (a browser opens about 6; raise it for many clients behind one NAT). Refused like --max-connections, logged once per address per minute. Default: 512.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" keepalive' -l 'keepalive' -d 'Overlay connections: after this long with nothing received, send an HTTP/2 PING, so a link that a NAT or firewall dropped without a word is noticed (and the idle mapping is kept alive). Default: 25s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" keepalive-timeout' -l 'keepalive-timeout' -d 'Overlay connections: close a connection (and redial, or stop routing to it) when nothing at all arrives within this long after its PING. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" resume-grace' -l 'resume-grace' -d 'How long a circuit whose network path is lost (a device\'s network change, a dead controller, a dropped link) is held for the device to resume it; the backend request goes on meanwhile. 0 ends the circuit with its path. Default: 60s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" resume-buffer' -l 'resume-buffer' -d 'Overlay gateway: what one circuit keeps of its answer until the device acknowledges it (B, KiB or MiB); at this bound it stops reading its backend. It is also the circuit\'s window: a larger one carries a bulk answer faster. Default: 3MiB; from 640KiB (a device owes an acknowledgement after 256KiB) to 4MiB.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" resume-per-identity' -l 'resume-per-identity' -d 'Overlay gateway: what the circuits of one device keep together beyond 640KiB each (KiB, MiB or GiB); a circuit past 640KiB stops reading its backend while its device is at this bound. Default: 32MiB.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" resume-total' -l 'resume-total' -d 'Overlay gateway: what all held circuits (their path lost) keep together (KiB, MiB or GiB), counting what each kept when it was held: a circuit that would go over it is not held (it ends with its path); held circuits stop reading their backends before they reach it. Default: 256MiB.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" resume-held-per-identity' -l 'resume-held-per-identity' -d 'Overlay gateway: the most circuits of one device held at once; a further circuit whose path is lost is not held (it ends with its path, and its backend request with it). Default: 64.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" config' -l 'config' -d 'YAML file of settings named like the long flags (examples in deploy/config/); flags and environment variables win over it. Env: ILS_CONFIG.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" log-level' -l 'log-level' -d 'Least severe level logged: trace, debug, info, notice, warning, error or critical. Default: info.' -rfka 'trace debug info notice warning error critical'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" log-format' -l 'log-format' -d 'text for people, json for log collectors (one object per line). Default: text.' -rfka 'text json'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" metrics' -l 'metrics' -d 'Serve Prometheus metrics, /healthz and /readyz on HOST:PORT (loopback only by default). Env: ILS_METRICS.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" metrics-allow-remote' -l 'metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" no-metrics-allow-remote' -l 'no-metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway serve" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" identity' -l 'identity' -d 'The device\'s identity file. Env: ILS_IDENTITY. Default: identities/device.json.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" service' -l 'service' -d 'The service to reach. Env: ILS_SERVICE. Default: claude-api.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" listen' -l 'listen' -d 'HOST:PORT to listen on. Env: ILS_LISTEN. Default: 127.0.0.1:8080.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" allow-remote' -l 'allow-remote' -d 'Allow a non-loopback --listen address (anyone who reaches it acts as this device). Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" no-allow-remote' -l 'no-allow-remote' -d 'Allow a non-loopback --listen address (anyone who reaches it acts as this device). Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel"' -l 'allowed-host' -d 'Also answer requests addressed to this Host (name, or name:port). Repeat for several. Env/config: ILS_ALLOWED_HOSTS / allowed-hosts, comma-separated.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel"' -l 'allow-origin' -d 'Let web pages of this origin (http://localhost:3000) send requests. Repeat for several. Env/config: ILS_ALLOW_ORIGINS / allow-origins, comma-separated. Default: none.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" resume-grace' -l 'resume-grace' -d 'How long a circuit whose network path is lost (a network change, a dead controller) keeps trying to resume; its client sees a pause. 0 ends it with its path, as before resumption, and offers the gateway no resumable circuit (nothing kept, no acknowledgements). Default: 60s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" idle-timeout' -l 'idle-timeout' -d 'With no circuit open, the controller connection sends no keepalive PING, and after this long it is closed: an idle tunnel sends nothing at all, and its next request connects again (about two round trips more). 0 keeps it open (still without PINGs). Default: 15s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" keepalive' -l 'keepalive' -d 'Overlay connections: after this long with nothing received, send an HTTP/2 PING, so a link that a NAT or firewall dropped without a word is noticed (and the idle mapping is kept alive). Default: 25s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" keepalive-timeout' -l 'keepalive-timeout' -d 'Overlay connections: close a connection (and redial, or stop routing to it) when nothing at all arrives within this long after its PING. Default: 10s.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" config' -l 'config' -d 'YAML file of settings named like the long flags (examples in deploy/config/); flags and environment variables win over it. Env: ILS_CONFIG.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" log-level' -l 'log-level' -d 'Least severe level logged: trace, debug, info, notice, warning, error or critical. Default: info.' -rfka 'trace debug info notice warning error critical'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" log-format' -l 'log-format' -d 'text for people, json for log collectors (one object per line). Default: text.' -rfka 'text json'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" metrics' -l 'metrics' -d 'Serve Prometheus metrics, /healthz and /readyz on HOST:PORT (loopback only by default). Env: ILS_METRICS.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" metrics-allow-remote' -l 'metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" no-metrics-allow-remote' -l 'no-metrics-allow-remote' -d 'Allow a non-loopback --metrics address. Default: off.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway tunnel" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway status" identity' -l 'identity' -d 'The identity file. Env: ILS_IDENTITY. Default: identities/admin.json.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway status" json' -l 'json' -d 'Print JSON.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway status" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway status" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway renew" identity' -l 'identity' -d 'The identity file. Env: ILS_IDENTITY. Default: identities/admin.json.' -rfka ''
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway renew" force' -l 'force' -d 'Renew even when the certificate is far from expiry.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway renew" version' -l 'version' -d 'Show the version.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway renew" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'ils-gateway' -n '__ils-gateway_should_offer_completions_for_flags_or_options "ils-gateway help" version' -l 'version' -d 'Show the version.'
