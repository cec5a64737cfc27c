# Sphinx's configuration for meshtensor's documentation site; scripts/docs.sh builds it (with
# Doxygen's XML of the public headers for the API reference) and says what it needs.
import os

project = 'meshtensor'
author = 'the meshtensor authors'
copyright = '2026, the meshtensor authors'

extensions = ['myst_parser', 'breathe']

# The guides are the Markdown files beside this one (MyST, Debian's python3-myst-parser); links
# between them keep working on GitHub and in the site alike.
source_suffix = {'.md': 'markdown'}
myst_heading_anchors = 4          # `page.md#a-heading` links resolve, as on GitHub
myst_enable_extensions = ['colon_fence']
exclude_patterns = ['_build', 'tools', 'README.md']

# The API reference: Doxygen's XML, written by scripts/docs.sh.
breathe_projects = {'meshtensor': os.environ.get('MESHTENSOR_DOXYGEN_XML', '../build/docs-xml/xml')}
breathe_default_project = 'meshtensor'
breathe_show_include = True
primary_domain = 'cpp'
highlight_language = 'none'   # a fence without a language is shown as written

html_theme = 'sphinx_rtd_theme'   # Debian's python3-sphinx-rtd-theme: the navigation a reader expects
html_title = 'meshtensor'
html_show_sourcelink = False
html_theme_options = {'navigation_depth': 3, 'collapse_navigation': False}
html_static_path = ['_static']
html_css_files = ['api.css']


def _remember_cpp_ids():
    """Sphinx 5's C++ domain (Debian bookworm's) recomputes a declaration's id from its whole AST
    each time a cross-reference compares it, for every candidate of every reference: 60% of the
    site's build (cProfile: 694,000 get_newest_id calls for 2,800 references). A declaration's id
    depends on it and its symbol alone, so each is computed once per declaration and symbol (Sphinx
    6 and later keep it too). Kept beside the declarations, not in them: their equality compares
    every attribute."""
    from sphinx.domains import cpp
    declaration = getattr(cpp, 'ASTDeclaration', None)
    if declaration is None or getattr(declaration, '_meshtensor_ids_remembered', False):
        return
    compute = declaration.get_newest_id
    remembered = {}  # id(declaration) -> (declaration, symbol, its id); the declaration kept alive

    def get_newest_id(self):
        if self.symbol is None:
            return compute(self)
        entry = remembered.get(id(self))
        if entry is None or entry[0] is not self or entry[1] is not self.symbol:
            entry = (self, self.symbol, compute(self))
            remembered[id(self)] = entry
        return entry[2]

    declaration.get_newest_id = get_newest_id
    declaration._meshtensor_ids_remembered = True


_remember_cpp_ids()
