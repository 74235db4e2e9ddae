#!/bin/bash

__ils-gateway_cursor_index_in_current_word() {
    local remaining="${COMP_LINE}"

    local word
    for word in "${COMP_WORDS[@]::COMP_CWORD}"; do
        remaining="${remaining##*([[:space:]])"${word}"*([[:space:]])}"
    done

    local -ir index="$((COMP_POINT - ${#COMP_LINE} + ${#remaining}))"
    if [[ "${index}" -le 0 ]]; then
        printf 0
    else
        printf %s "${index}"
    fi
}

# positional arguments:
#
# - 1: the current (sub)command's count of positional arguments
#
# required variables:
#
# - repeating_flags: the repeating flags that the current (sub)command can accept
# - non_repeating_flags: the non-repeating flags that the current (sub)command can accept
# - repeating_options: the repeating options that the current (sub)command can accept
# - non_repeating_options: the non-repeating options that the current (sub)command can accept
# - positional_number: value ignored
# - unparsed_words: unparsed words from the current command line
#
# modified variables:
#
# - non_repeating_flags: remove flags for this (sub)command that are already on the command line
# - non_repeating_options: remove options for this (sub)command that are already on the command line
# - positional_number: set to the current positional number
# - unparsed_words: remove all flags, options, and option values for this (sub)command
__ils-gateway_offer_flags_options() {
    local -ir positional_count="${1}"
    positional_number=0

    local was_flag_option_terminator_seen=false
    local is_parsing_option_value=false

    local -ar unparsed_word_indices=("${!unparsed_words[@]}")
    local -i word_index
    for word_index in "${unparsed_word_indices[@]}"; do
        if "${is_parsing_option_value}"; then
            # This word is an option value:
            # Reset marker for next word iff not currently the last word
            [[ "${word_index}" -ne "${unparsed_word_indices[${#unparsed_word_indices[@]} - 1]}" ]] && is_parsing_option_value=false
            unset "unparsed_words[${word_index}]"
            # Do not process this word as a flag or an option
            continue
        fi

        local word="${unparsed_words["${word_index}"]}"
        if ! "${was_flag_option_terminator_seen}"; then
            case "${word}" in
            --)
                unset "unparsed_words[${word_index}]"
                # by itself -- is a flag/option terminator, but if it is the last word, it is the start of a completion
                if [[ "${word_index}" -ne "${unparsed_word_indices[${#unparsed_word_indices[@]} - 1]}" ]]; then
                    was_flag_option_terminator_seen=true
                fi
                continue
                ;;
            -*)
                # ${word} is a flag or an option
                # If ${word} is an option, mark that the next word to be parsed is an option value
                local option
                for option in "${repeating_options[@]}" "${non_repeating_options[@]}"; do
                    [[ "${word}" = "${option}" ]] && is_parsing_option_value=true && break
                done

                # Remove ${word} from ${non_repeating_flags} or ${non_repeating_options} so it isn't offered again
                local not_found=true
                local -i index
                for index in "${!non_repeating_flags[@]}"; do
                    if [[ "${non_repeating_flags[${index}]}" = "${word}" ]]; then
                        unset "non_repeating_flags[${index}]"
                        non_repeating_flags=("${non_repeating_flags[@]}")
                        not_found=false
                        break
                    fi
                done
                if "${not_found}"; then
                    for index in "${!non_repeating_flags[@]}"; do
                        if [[ "${non_repeating_flags[${index}]}" = "${word}" ]]; then
                            unset "non_repeating_flags[${index}]"
                            non_repeating_flags=("${non_repeating_flags[@]}")
                            break
                        fi
                    done
                fi
                unset "unparsed_words[${word_index}]"
                continue
                ;;
            esac
        fi

        # ${word} is neither a flag, nor an option, nor an option value
        if [[ "${positional_number}" -lt "${positional_count}" || "${positional_count}" -lt 0 ]]; then
            # ${word} is a positional
            ((positional_number++))
            unset "unparsed_words[${word_index}]"
        else
            if [[ -z "${word}" ]]; then
                # Could be completing a flag, option, or subcommand
                positional_number=-1
            else
                # ${word} is a subcommand or invalid, so stop processing this (sub)command
                positional_number=-2
            fi
            break
        fi
    done

    unparsed_words=("${unparsed_words[@]}")

    if\
        ! "${was_flag_option_terminator_seen}"\
        && ! "${is_parsing_option_value}"\
        && [[ ("${cur}" = -* && "${positional_number}" -ge 0) || "${positional_number}" -eq -1 ]]
    then
        COMPREPLY+=($(compgen -W "${repeating_flags[*]} ${non_repeating_flags[*]} ${repeating_options[*]} ${non_repeating_options[*]}" -- "${cur}"))
    fi
}

__ils-gateway_add_completions() {
    local completion
    while IFS='' read -r completion; do
        COMPREPLY+=("${completion}")
    done < <(IFS=$'\n' compgen "${@}" -- "${cur}")
}

__ils-gateway_custom_complete() {
    if [[ -n "${cur}" || -z ${COMP_WORDS[${COMP_CWORD}]} || "${COMP_LINE:${COMP_POINT}:1}" != ' ' ]]; then
        local -ar words=("${COMP_WORDS[@]}")
    else
        local -ar words=("${COMP_WORDS[@]::${COMP_CWORD}}" '' "${COMP_WORDS[@]:${COMP_CWORD}}")
    fi

    "${COMP_WORDS[0]}" "${@}" "${words[@]}"
}

_ils-gateway() {
    local state
    state="$(shopt -p;shopt -po)"
    trap "${state//$'\n'/;}" RETURN
    shopt -s extglob
    set +o history +o posix

    local -xr SAP_SHELL=bash
    local -x SAP_SHELL_VERSION
    SAP_SHELL_VERSION="$(IFS='.';printf %s "${BASH_VERSINFO[*]}")"
    local -r SAP_SHELL_VERSION

    local -r cur="${2}"
    local -r prev="${3}"

    local -i positional_number
    local -a unparsed_words=("${COMP_WORDS[@]:1:${COMP_CWORD}}")

    local -a repeating_flags=()
    local -a non_repeating_flags=(--version -h --help)
    local -a repeating_options=()
    local -a non_repeating_options=()
    __ils-gateway_offer_flags_options 0

    # Offer subcommand / subcommand argument completions
    local -r subcommand="${unparsed_words[0]}"
    unset 'unparsed_words[0]'
    unparsed_words=("${unparsed_words[@]}")
    case "${subcommand}" in
    controller|admin|enroll|serve|tunnel|status|renew|help)
        # Offer subcommand argument completions
        "_ils-gateway_${subcommand}"
        ;;
    *)
        # Offer subcommand completions
        COMPREPLY+=($(compgen -W 'controller admin enroll serve tunnel status renew help' -- "${cur}"))
        ;;
    esac
}

_ils-gateway_controller() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=()
    __ils-gateway_offer_flags_options 0

    # Offer subcommand / subcommand argument completions
    local -r subcommand="${unparsed_words[0]}"
    unset 'unparsed_words[0]'
    unparsed_words=("${unparsed_words[@]}")
    case "${subcommand}" in
    init|join|run|migrate|rotate-tls)
        # Offer subcommand argument completions
        "_ils-gateway_controller_${subcommand}"
        ;;
    *)
        # Offer subcommand completions
        COMPREPLY+=($(compgen -W 'init join run migrate rotate-tls' -- "${cur}"))
        ;;
    esac
}

_ils-gateway_controller_init() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--state-dir --store --address --admin-out)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--state-dir')
        return
        ;;
    '--store')
        return
        ;;
    '--address')
        return
        ;;
    '--admin-out')
        return
        ;;
    esac
}

_ils-gateway_controller_join() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--state-dir --store --identity --address)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--state-dir')
        return
        ;;
    '--store')
        return
        ;;
    '--identity')
        return
        ;;
    '--address')
        return
        ;;
    esac
}

_ils-gateway_controller_run() {
    repeating_flags=()
    non_repeating_flags=(--metrics-allow-remote --no-metrics-allow-remote --version -h --help)
    repeating_options=()
    non_repeating_options=(--state-dir --store --listen --max-connections --max-connections-per-source --request-head-timeout --request-body-timeout --max-circuits-per-identity --circuit-opens-per-second --config --log-level --log-format --metrics --audit-retention --audit-max-rows --keepalive --keepalive-timeout)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--state-dir')
        return
        ;;
    '--store')
        return
        ;;
    '--listen')
        return
        ;;
    '--max-connections')
        return
        ;;
    '--max-connections-per-source')
        return
        ;;
    '--request-head-timeout')
        return
        ;;
    '--request-body-timeout')
        return
        ;;
    '--max-circuits-per-identity')
        return
        ;;
    '--circuit-opens-per-second')
        return
        ;;
    '--config')
        return
        ;;
    '--log-level')
        __ils-gateway_add_completions -W 'trace'$'\n''debug'$'\n''info'$'\n''notice'$'\n''warning'$'\n''error'$'\n''critical'
        return
        ;;
    '--log-format')
        __ils-gateway_add_completions -W 'text'$'\n''json'
        return
        ;;
    '--metrics')
        return
        ;;
    '--audit-retention')
        return
        ;;
    '--audit-max-rows')
        return
        ;;
    '--keepalive')
        return
        ;;
    '--keepalive-timeout')
        return
        ;;
    esac
}

_ils-gateway_controller_migrate() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--from --to)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--from')
        return
        ;;
    '--to')
        return
        ;;
    esac
}

_ils-gateway_controller_rotate-tls() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--state-dir --store --address)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--state-dir')
        return
        ;;
    '--store')
        return
        ;;
    '--address')
        return
        ;;
    esac
}

_ils-gateway_admin() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac

    # Offer subcommand / subcommand argument completions
    local -r subcommand="${unparsed_words[0]}"
    unset 'unparsed_words[0]'
    unparsed_words=("${unparsed_words[@]}")
    case "${subcommand}" in
    identity|service|sessions|audit|console)
        # Offer subcommand argument completions
        "_ils-gateway_admin_${subcommand}"
        ;;
    *)
        # Offer subcommand completions
        COMPREPLY+=($(compgen -W 'identity service sessions audit console' -- "${cur}"))
        ;;
    esac
}

_ils-gateway_admin_identity() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=()
    __ils-gateway_offer_flags_options 0

    # Offer subcommand / subcommand argument completions
    local -r subcommand="${unparsed_words[0]}"
    unset 'unparsed_words[0]'
    unparsed_words=("${unparsed_words[@]}")
    case "${subcommand}" in
    create|list|show|update|revoke|disable|enable|delete|reissue)
        # Offer subcommand argument completions
        "_ils-gateway_admin_identity_${subcommand}"
        ;;
    *)
        # Offer subcommand completions
        COMPREPLY+=($(compgen -W 'create list show update revoke disable enable delete reissue' -- "${cur}"))
        ;;
    esac
}

_ils-gateway_admin_identity_create() {
    repeating_flags=()
    non_repeating_flags=(--qr --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --role --attributes --expires --output -o --qr-png)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--role')
        __ils-gateway_add_completions -W 'device'$'\n''gateway'$'\n''admin'
        return
        ;;
    '--attributes')
        return
        ;;
    '--expires')
        return
        ;;
    '--output'|'-o')
        return
        ;;
    '--qr-png')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_list() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_show() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_update() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --attributes)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--attributes')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_revoke() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_disable() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_enable() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_delete() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_identity_reissue() {
    repeating_flags=()
    non_repeating_flags=(--qr --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --expires --output -o --qr-png)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--expires')
        return
        ;;
    '--output'|'-o')
        return
        ;;
    '--qr-png')
        return
        ;;
    esac
}

_ils-gateway_admin_service() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=()
    __ils-gateway_offer_flags_options 0

    # Offer subcommand / subcommand argument completions
    local -r subcommand="${unparsed_words[0]}"
    unset 'unparsed_words[0]'
    unparsed_words=("${unparsed_words[@]}")
    case "${subcommand}" in
    create|list|show|update|delete)
        # Offer subcommand argument completions
        "_ils-gateway_admin_service_${subcommand}"
        ;;
    *)
        # Offer subcommand completions
        COMPREPLY+=($(compgen -W 'create list show update delete' -- "${cur}"))
        ;;
    esac
}

_ils-gateway_admin_service_create() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --dial --dial-semantic --bind --bind-semantic)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--dial')
        return
        ;;
    '--dial-semantic')
        return
        ;;
    '--bind')
        return
        ;;
    '--bind-semantic')
        return
        ;;
    esac
}

_ils-gateway_admin_service_list() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_service_show() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_service_update() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --dial --dial-semantic --bind --bind-semantic)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--dial')
        return
        ;;
    '--dial-semantic')
        return
        ;;
    '--bind')
        return
        ;;
    '--bind-semantic')
        return
        ;;
    esac
}

_ils-gateway_admin_service_delete() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_sessions() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_admin_audit() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity --since --before --limit --actor --action --target)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--since')
        return
        ;;
    '--before')
        return
        ;;
    '--limit')
        return
        ;;
    '--actor')
        return
        ;;
    '--action')
        return
        ;;
    '--target')
        return
        ;;
    esac
}

_ils-gateway_admin_console() {
    repeating_flags=()
    non_repeating_flags=(--version -h --help)
    repeating_options=(--allowed-host)
    non_repeating_options=(--identity --listen --tls-cert --tls-key --max-connections --max-connections-per-source --request-head-timeout --request-body-timeout --log-level --log-format)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--listen')
        return
        ;;
    '--tls-cert')
        return
        ;;
    '--tls-key')
        return
        ;;
    '--allowed-host')
        return
        ;;
    '--max-connections')
        return
        ;;
    '--max-connections-per-source')
        return
        ;;
    '--request-head-timeout')
        return
        ;;
    '--request-body-timeout')
        return
        ;;
    '--log-level')
        __ils-gateway_add_completions -W 'trace'$'\n''debug'$'\n''info'$'\n''notice'$'\n''warning'$'\n''error'$'\n''critical'
        return
        ;;
    '--log-format')
        __ils-gateway_add_completions -W 'text'$'\n''json'
        return
        ;;
    esac
}

_ils-gateway_enroll() {
    repeating_flags=()
    non_repeating_flags=(--force --pem --version -h --help)
    repeating_options=()
    non_repeating_options=(--out)
    __ils-gateway_offer_flags_options 1

    # Offer option value completions
    case "${prev}" in
    '--out')
        return
        ;;
    esac
}

_ils-gateway_serve() {
    repeating_flags=()
    non_repeating_flags=(--plain-http --no-plain-http --metrics-allow-remote --no-metrics-allow-remote --version -h --help)
    repeating_options=()
    non_repeating_options=(--mode --identity --service --client-auth --policy-grace --hsts-max-age --backend --listen --tls-cert --tls-key --backend-header-timeout --backend-connect-timeout --backend-max-connections --idle-timeout --client-stall-timeout --drain-timeout --max-connections --max-connections-per-source --keepalive --keepalive-timeout --resume-grace --resume-buffer --resume-per-identity --resume-total --resume-held-per-identity --config --log-level --log-format --metrics)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--mode')
        __ils-gateway_add_completions -W 'ziti'$'\n''http'
        return
        ;;
    '--identity')
        return
        ;;
    '--service')
        return
        ;;
    '--client-auth')
        __ils-gateway_add_completions -W 'required'$'\n''none'
        return
        ;;
    '--policy-grace')
        return
        ;;
    '--hsts-max-age')
        return
        ;;
    '--backend')
        return
        ;;
    '--listen')
        return
        ;;
    '--tls-cert')
        return
        ;;
    '--tls-key')
        return
        ;;
    '--backend-header-timeout')
        return
        ;;
    '--backend-connect-timeout')
        return
        ;;
    '--backend-max-connections')
        return
        ;;
    '--idle-timeout')
        return
        ;;
    '--client-stall-timeout')
        return
        ;;
    '--drain-timeout')
        return
        ;;
    '--max-connections')
        return
        ;;
    '--max-connections-per-source')
        return
        ;;
    '--keepalive')
        return
        ;;
    '--keepalive-timeout')
        return
        ;;
    '--resume-grace')
        return
        ;;
    '--resume-buffer')
        return
        ;;
    '--resume-per-identity')
        return
        ;;
    '--resume-total')
        return
        ;;
    '--resume-held-per-identity')
        return
        ;;
    '--config')
        return
        ;;
    '--log-level')
        __ils-gateway_add_completions -W 'trace'$'\n''debug'$'\n''info'$'\n''notice'$'\n''warning'$'\n''error'$'\n''critical'
        return
        ;;
    '--log-format')
        __ils-gateway_add_completions -W 'text'$'\n''json'
        return
        ;;
    '--metrics')
        return
        ;;
    esac
}

_ils-gateway_tunnel() {
    repeating_flags=()
    non_repeating_flags=(--allow-remote --no-allow-remote --metrics-allow-remote --no-metrics-allow-remote --version -h --help)
    repeating_options=(--allowed-host --allow-origin)
    non_repeating_options=(--identity --service --listen --resume-grace --idle-timeout --keepalive --keepalive-timeout --config --log-level --log-format --metrics)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    '--service')
        return
        ;;
    '--listen')
        return
        ;;
    '--allowed-host')
        return
        ;;
    '--allow-origin')
        return
        ;;
    '--resume-grace')
        return
        ;;
    '--idle-timeout')
        return
        ;;
    '--keepalive')
        return
        ;;
    '--keepalive-timeout')
        return
        ;;
    '--config')
        return
        ;;
    '--log-level')
        __ils-gateway_add_completions -W 'trace'$'\n''debug'$'\n''info'$'\n''notice'$'\n''warning'$'\n''error'$'\n''critical'
        return
        ;;
    '--log-format')
        __ils-gateway_add_completions -W 'text'$'\n''json'
        return
        ;;
    '--metrics')
        return
        ;;
    esac
}

_ils-gateway_status() {
    repeating_flags=()
    non_repeating_flags=(--json --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_renew() {
    repeating_flags=()
    non_repeating_flags=(--force --version -h --help)
    repeating_options=()
    non_repeating_options=(--identity)
    __ils-gateway_offer_flags_options 0

    # Offer option value completions
    case "${prev}" in
    '--identity')
        return
        ;;
    esac
}

_ils-gateway_help() {
    repeating_flags=()
    non_repeating_flags=(--version)
    repeating_options=()
    non_repeating_options=()
    __ils-gateway_offer_flags_options -1
}

complete -o filenames -F _ils-gateway ils-gateway
