#!/usr/bin/env bash
# Checks the relative links of the Markdown pages: README.md, CONTRIBUTING.md, CHANGELOG.md and
# every docs/**/*.md. Each [text](target) outside code must name a file or folder that exists,
# and a #fragment must name a heading of the target page (GitHub's slug: lower case, spaces to
# hyphens, punctuation dropped) or an <a id="..."> / <a name="..."> in it. Links to other sites
# (scheme://, mailto:) are not followed. Prints every broken link as file:line: target and exits 1
# when there is one.
#
# Usage: scripts/check_links.sh [source dir] (default: the repository this script is in)
set -euo pipefail

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"

pages=(README.md CONTRIBUTING.md CHANGELOG.md)
while IFS= read -r page; do
    pages+=("$page")
done < <(find docs -name '*.md' | sort)

# Prints, for one page, the anchors it defines, one a line.
anchors_of() {
    awk '
        /^[ \t]*(```|~~~)/ { fence = !fence; next }
        fence { next }
        /^#+[ \t]/ {
            h = $0
            sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#*[ \t]*$/, "", h)
            h = tolower(h)
            gsub(/[^a-z0-9 _\200-\377-]/, "", h)   # GitHub keeps letters, digits, spaces, - and _
            gsub(/ /, "-", h)
            n = seen[h]++
            print (n ? h "-" n : h)
        }
        {
            line = $0
            while (match(line, /<a (id|name)="[^"]*"/)) {
                a = substr(line, RSTART, RLENGTH)
                sub(/^<a (id|name)="/, "", a); sub(/"$/, "", a)
                print a
                line = substr(line, RSTART + RLENGTH)
            }
        }' "$1"
}

# Prints, for one page, "line<TAB>target" for each link outside code.
links_of() {
    awk '
        /^[ \t]*(```|~~~)/ { fence = !fence; next }
        fence { next }
        {
            line = $0
            gsub(/``[^`]*``/, "", line)
            gsub(/`[^`]*`/, "", line)
            while (match(line, /\]\([^) \t]+\)/)) {
                t = substr(line, RSTART + 2, RLENGTH - 3)
                print NR "\t" t
                line = substr(line, RSTART + RLENGTH)
            }
        }' "$1"
}

broken=0
checked=0
for page in "${pages[@]}"; do
    [ -f "$page" ] || continue
    dir="$(dirname "$page")"
    while IFS=$'\t' read -r line target; do
        case "$target" in
            *://* | mailto:*) continue ;;
        esac
        checked=$((checked + 1))
        path="${target%%#*}"
        fragment=""
        [ "$path" = "$target" ] || fragment="${target#*#}"
        if [ -z "$path" ]; then
            file="$page"
        else
            file="$dir/$path"
        fi
        if [ ! -e "$file" ]; then
            echo "$page:$line: $target: no such file ($file)"
            broken=$((broken + 1))
            continue
        fi
        if [ -n "$fragment" ]; then
            if [ ! -f "$file" ] || ! anchors_of "$file" | grep -qxF -- "$fragment"; then
                echo "$page:$line: $target: no heading or anchor '#$fragment' in $file"
                broken=$((broken + 1))
            fi
        fi
    done < <(links_of "$page")
done

if [ "$broken" -gt 0 ]; then
    echo "$broken broken link(s) of $checked checked"
    exit 1
fi
echo "all $checked relative links resolve (${#pages[@]} pages)"
