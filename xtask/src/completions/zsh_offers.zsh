# What zsh's completion system offers for a command line, for the xtask's tests: an
# interactive zsh on a pseudo-terminal (zsh/zpty; completion widgets run only under zle) loads
# the completion directory, the line is typed with a TAB, and every word the completion
# functions add (compadd) is written to a file instead of the screen.
#
# usage: zsh -f zsh_offers.zsh COMPLETION_DIR OUT_FILE LINE
# Exits once the inner shell has run the completion and exited; OUT_FILE then ends with a line
# `<done>`. The caller bounds the whole run with a timeout.
emulate -L zsh
zmodload zsh/zpty || exit 3
dir=$1 out=$2 line=$3

zpty lr zsh -f -i
# Each write is one line the inner shell reads and runs, in order. compinit -u: the test
# runs as whichever user, in directories it did not make; -D: no dump file.
zpty -w lr "PROMPT='' RPROMPT='' fpath=(${(q)dir} \$fpath)"
zpty -w lr 'autoload -Uz compinit && compinit -u -D'
zpty -w lr "out=${(q)out}"
# A compadd that asks for the matches into an array (-A) is internal bookkeeping of the
# completion functions; any other call adds words: record them, then add them as asked.
zpty -w lr 'compadd() { if (( ${@[(I)-[OAD]]} )); then builtin compadd "$@"; return; fi; local -a got; builtin compadd -A got "$@"; (( $#got )) && print -rl -- $got >> $out; builtin compadd "$@" }'
zpty -w lr 'lr_done() { print -r -- "<done>" >> $out; exit }; comppostfuncs=(lr_done)'
zpty -w lr "bindkey '^I' complete-word"
zpty -w -n lr "$line"$'\t'
# Drain the terminal until the inner shell exits (lr_done).
while zpty -r lr chunk; do :; done
zpty -d lr
