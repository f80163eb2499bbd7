# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_saguin_global_optspecs
    string join \n h/help V/version
end

function __fish_saguin_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_saguin_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_saguin_using_subcommand
    set -l cmd (__fish_saguin_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c saguin -n "__fish_saguin_needs_command" -s h -l help -d 'Print help'
complete -c saguin -n "__fish_saguin_needs_command" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "serve" -d 'Serve MQTT'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "check-config" -d 'Validate a configuration, and print it fully resolved'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "snapshot" -d 'Inspect and verify snapshot files and directories'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "sqlite" -d 'Read and back up a sqlite provider\'s database'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "migrate" -d 'Move a provider\'s data to another provider kind'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "lock" -d 'Tell whether a provider\'s lock is held, and by whom'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "passwd" -d 'Add, change or delete a user in a password file (mosquitto_passwd\'s format)'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "status" -d 'Ask a running broker how it is, over its metrics listener'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "bench" -d 'Measure what this machine and its disk cost the configured providers'
complete -c saguin -n "__fish_saguin_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand serve" -l config -d 'The configuration file (YAML). Without it: one listener on 127.0.0.1:1883, anonymous, everything in memory, nothing kept' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand serve" -l bind -d 'Serve the embedded default on this address (IP:PORT, e.g. 0.0.0.0:1884; port 0 lets the system choose) instead of 127.0.0.1:1883. Only without --config: a configuration file names its own listeners, and the flag is refused rather than merged' -r
complete -c saguin -n "__fish_saguin_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand serve" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand check-config" -l config -d 'The configuration file (YAML). Without it, the embedded default: one listener on 127.0.0.1:1883, anonymous, nothing kept' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand check-config" -l output -d 'Print the fully resolved configuration on stdout as one YAML (the default) or JSON document' -r -f -a "yaml\t''
json\t''"
complete -c saguin -n "__fish_saguin_using_subcommand check-config" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand check-config" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and not __fish_seen_subcommand_from inspect verify help" -s h -l help -d 'Print help'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and not __fish_seen_subcommand_from inspect verify help" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and not __fish_seen_subcommand_from inspect verify help" -f -a "inspect" -d 'Show what a snapshot directory, format 21 file or MBMQTT01 file holds'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and not __fish_seen_subcommand_from inspect verify help" -f -a "verify" -d 'Decode and validate snapshot files as the broker does at startup'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and not __fish_seen_subcommand_from inspect verify help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -l limit -d 'At most this many records per channel' -r
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -l channel -d 'Only this channel' -r
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -l max-bytes -d 'Refuse a file larger than this: bytes, or a size with a unit as in the configuration (10MiB binary, 10MB decimal). Default: 64MiB for MBMQTT01, 4GiB for format 21' -r
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -l records -d 'List records'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from inspect" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from verify" -l max-bytes -d 'Refuse a file larger than this: bytes, or a size with a unit as in the configuration (10MiB binary, 10MB decimal). Default: 64MiB for MBMQTT01, 4GiB for format 21' -r
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from verify" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from verify" -l quiet -d 'Print nothing; the exit code answers'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from verify" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "inspect" -d 'Show what a snapshot directory, format 21 file or MBMQTT01 file holds'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "verify" -d 'Decode and validate snapshot files as the broker does at startup'
complete -c saguin -n "__fish_saguin_using_subcommand snapshot; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -s h -l help -d 'Print help'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -f -a "dump" -d 'Show what a sqlite provider\'s database holds (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -f -a "backup" -d 'Take an online, consistent, verified copy of a database'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -f -a "verify" -d 'Check a database\'s pages and the invariants its rows keep (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and not __fish_seen_subcommand_from dump backup verify help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -l channel -d 'List this channel\'s records' -r
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -l from -d 'First offset to list (default: the channel\'s floor)' -r
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -l limit -d 'At most this many records' -r
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -l ndjson -d 'One JSON object per line on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from dump" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from backup" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from backup" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from verify" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from verify" -l quiet -d 'Print nothing; the exit code answers'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from verify" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from help" -f -a "dump" -d 'Show what a sqlite provider\'s database holds (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from help" -f -a "backup" -d 'Take an online, consistent, verified copy of a database'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from help" -f -a "verify" -d 'Check a database\'s pages and the invariants its rows keep (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand sqlite; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -s h -l help -d 'Print help'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -f -a "to-sqlite" -d 'Move a memory provider\'s snapshot directory into a new sqlite database'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -f -a "to-snapshots" -d 'Move a sqlite database into a new snapshot directory'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -f -a "from-mbmqtt" -d 'Import a legacy MBMQTT01 broker.snapshot'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and not __fish_seen_subcommand_from to-sqlite to-snapshots from-mbmqtt help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-sqlite" -l config -d 'Refused: a migration reads and writes only the paths it is given' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-sqlite" -l json -d 'One JSON document on stdout (the report), diagnostics on stderr'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-sqlite" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-sqlite" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-snapshots" -l config -d 'Refused: a migration reads and writes only the paths it is given' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-snapshots" -l json -d 'One JSON document on stdout (the report), diagnostics on stderr'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-snapshots" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from to-snapshots" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -l to-sqlite -r -F
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -l to-snapshots -r -F
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -l max-bytes -d 'Refuse a broker.snapshot larger than this: bytes, or a size with a unit as in the configuration (10MiB binary, 10MB decimal)' -r
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -l config -d 'Refused: a migration reads and writes only the paths it is given' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -l json -d 'One JSON document on stdout (the report), diagnostics on stderr'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from from-mbmqtt" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from help" -f -a "to-sqlite" -d 'Move a memory provider\'s snapshot directory into a new sqlite database'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from help" -f -a "to-snapshots" -d 'Move a sqlite database into a new snapshot directory'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from help" -f -a "from-mbmqtt" -d 'Import a legacy MBMQTT01 broker.snapshot'
complete -c saguin -n "__fish_saguin_using_subcommand migrate; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and not __fish_seen_subcommand_from status help" -s h -l help -d 'Print help'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and not __fish_seen_subcommand_from status help" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and not __fish_seen_subcommand_from status help" -f -a "status" -d 'Free, held (by whom, since when), or stale: left by a process that died holding it'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and not __fish_seen_subcommand_from status help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and __fish_seen_subcommand_from status" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and __fish_seen_subcommand_from status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and __fish_seen_subcommand_from status" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and __fish_seen_subcommand_from help" -f -a "status" -d 'Free, held (by whom, since when), or stale: left by a process that died holding it'
complete -c saguin -n "__fish_saguin_using_subcommand lock; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s I -l iterations -d 'PBKDF2 iterations for the hashes written (mosquitto_passwd\'s default is 101; every CONNECT with a password pays them once)' -r
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s b -d 'Batch: take PASSWORD from the command line instead of asking. The password is then visible to other users in the process list; piping it on stdin avoids that'
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s D -d 'Delete USER from FILE'
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s U -d 'Upgrade FILE in place: hash every plain-text `user:password` line, keeping lines that are hashed already'
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand passwd" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand status" -l metrics -d 'The broker\'s metrics listener, HOST:PORT (its metrics.bind)' -r
complete -c saguin -n "__fish_saguin_using_subcommand status" -l config -d 'Read the listener\'s address from this configuration\'s metrics.bind (only that key is read; check-config validates the rest)' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand status" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand status" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand bench" -l config -d 'The configuration whose providers are measured' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand bench" -l dir -d 'Measure this directory\'s disk instead (it must not be a memory provider\'s snapshot directory)' -r -F
complete -c saguin -n "__fish_saguin_using_subcommand bench" -l timeout-stop -d 'The supervisor\'s stop timeout the shutdown is held to, in seconds (systemd\'s TimeoutStopSec; 90 is its default)' -r
complete -c saguin -n "__fish_saguin_using_subcommand bench" -l quick -d 'A run under 10 seconds: fewer samples, shorter publishing (a provider of thousands of channels takes longer)'
complete -c saguin -n "__fish_saguin_using_subcommand bench" -l json -d 'One JSON document on stdout'
complete -c saguin -n "__fish_saguin_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c saguin -n "__fish_saguin_using_subcommand bench" -s V -l version -d 'Print version'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "serve" -d 'Serve MQTT'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "check-config" -d 'Validate a configuration, and print it fully resolved'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "snapshot" -d 'Inspect and verify snapshot files and directories'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "sqlite" -d 'Read and back up a sqlite provider\'s database'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "migrate" -d 'Move a provider\'s data to another provider kind'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "lock" -d 'Tell whether a provider\'s lock is held, and by whom'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "passwd" -d 'Add, change or delete a user in a password file (mosquitto_passwd\'s format)'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "status" -d 'Ask a running broker how it is, over its metrics listener'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "bench" -d 'Measure what this machine and its disk cost the configured providers'
complete -c saguin -n "__fish_saguin_using_subcommand help; and not __fish_seen_subcommand_from serve check-config snapshot sqlite migrate lock passwd status bench help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from snapshot" -f -a "inspect" -d 'Show what a snapshot directory, format 21 file or MBMQTT01 file holds'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from snapshot" -f -a "verify" -d 'Decode and validate snapshot files as the broker does at startup'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from sqlite" -f -a "dump" -d 'Show what a sqlite provider\'s database holds (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from sqlite" -f -a "backup" -d 'Take an online, consistent, verified copy of a database'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from sqlite" -f -a "verify" -d 'Check a database\'s pages and the invariants its rows keep (read-only)'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from migrate" -f -a "to-sqlite" -d 'Move a memory provider\'s snapshot directory into a new sqlite database'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from migrate" -f -a "to-snapshots" -d 'Move a sqlite database into a new snapshot directory'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from migrate" -f -a "from-mbmqtt" -d 'Import a legacy MBMQTT01 broker.snapshot'
complete -c saguin -n "__fish_saguin_using_subcommand help; and __fish_seen_subcommand_from lock" -f -a "status" -d 'Free, held (by whom, since when), or stale: left by a process that died holding it'
