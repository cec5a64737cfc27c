#!/bin/sh
# Doxygen's INPUT_FILTER in scripts/docs.sh: the header's text as docs/tools/doxygen_filter.py
# rewrote it, from the copy its --into wrote under $MESHTENSOR_DOXYGEN_FILTERED (Doxygen passes
# absolute paths); a header without a copy (a path spelled otherwise) is filtered here.
copy="$MESHTENSOR_DOXYGEN_FILTERED$1"
if [ -f "$copy" ]; then exec cat -- "$copy"; fi
exec python3 docs/tools/doxygen_filter.py "$1"
