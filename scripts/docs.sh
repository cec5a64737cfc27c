#!/usr/bin/env bash
# Builds the documentation site into build/docs (or $MESHTENSOR_BUILD_DIR/docs); open its
# index.html in a browser. Doxygen reads the public headers' comments (docs/Doxyfile),
# docs/tools/api_pages.py writes the API reference's pages (docs/api/, generated, not kept), and
# Sphinx renders docs/ with MyST (the Markdown) and Breathe (the API; docs/conf.py). Warnings of
# either are errors, so a broken reference fails here rather than in a reader's browser.
# Installs what is missing first, from Debian (with sudo where not root): doxygen, python3-sphinx,
# python3-breathe, python3-myst-parser, python3-sphinx-rtd-theme (about 20 MB). About a minute.
# MESHTENSOR_DOCS_INSTALL=0 installs nothing: where something is missing it says what and exits 77
# (the docs tests are then skipped, not failed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=${MESHTENSOR_BUILD_DIR:-$root/build}
site=$base/docs
work=$base/docs-work               # Doxygen's XML and Sphinx's doctrees: not part of the site
python=/usr/bin/python3            # Debian's Sphinx and its extensions are its modules
started=$SECONDS

have_tools() {
  command -v doxygen >/dev/null &&
    "$python" -c 'import sphinx, breathe, myst_parser, sphinx_rtd_theme' 2>/dev/null
}
if ! have_tools && [ "${MESHTENSOR_DOCS_INSTALL:-1}" = 0 ]; then
  echo "SKIPPED: the documentation's generators are missing (doxygen; Sphinx with breathe, myst_parser and sphinx_rtd_theme for $python): scripts/install_deps.sh installs them"
  exit 77
fi
if ! have_tools; then
  # install_deps.sh names the packages and does the logging (sourcing it only defines them).
  source "$root/scripts/install_deps.sh"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  open_log
  log "installing the documentation's Debian packages: ${DOCS_PACKAGES[*]} (log: $LOG)"
  run_logged "apt-get update" $SUDO apt-get update
  run_logged "installing Debian packages" \
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${DOCS_PACKAGES[@]}"
  have_tools || { echo "docs.sh: doxygen, or Sphinx with breathe, myst_parser and sphinx_rtd_theme for $python, still missing" >&2; exit 1; }
fi

cd "$root"
echo "[docs] Doxygen: the public headers' comments into $work/xml" >&2
# A fresh build each time: Breathe's cache of the last build names XML files that may be gone,
# and a page no longer in docs/ must not stay on the site.
rm -rf "$work/xml" "$work/doctrees" "$site"
mkdir -p "$work"
# The headers as Doxygen is shown them (docs/tools/doxygen_filter.py), in one process: Doxygen's
# INPUT_FILTER (docs/tools/doxygen_cached_filter.sh) reads these copies.
rm -rf "$work/filtered"
find include/meshtensor -name '*.hpp' -print0 | xargs -0 "$python" docs/tools/doxygen_filter.py --into "$work/filtered"
MESHTENSOR_DOXYGEN_FILTERED=$work/filtered MESHTENSOR_DOXYGEN_OUT=$work doxygen docs/Doxyfile || {
  echo "docs.sh: Doxygen failed or warned ($work/warnings.log):" >&2; cat "$work/warnings.log" >&2; exit 1; }
"$python" docs/tools/api_pages.py include docs/api "$work/xml"
echo "[docs] Sphinx: docs/ into $site" >&2
MESHTENSOR_DOXYGEN_XML=$work/xml "$python" -m sphinx -b html -W --keep-going -q -d "$work/doctrees" docs "$site"
echo "[docs] done in $((SECONDS - started)) s: open $site/index.html" >&2
