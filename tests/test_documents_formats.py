"""Marked-up documents read as documents: title from the first heading, every chunk under its heading path, text
without markup but with its code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lazyhippo.sources.files import read_source
from lazyhippo.stages.chunks import chunk_document

GITDOCS = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "gitdocs" / "src"

REST = """\
.. _guide:

============
 Sync Guide
============

.. toctree::
   :maxdepth: 2

   install

Configuration
=============

Call :func:`~pkg.module.func` with ``retries=3`` before :class:`Client <pkg.Client>`.
See `the docs <https://example.com>`_ and the glossary_ [1]_.

.. note:: The *first* call
   blocks until **ready**.

.. versionchanged:: 2.1
   The ``timeout`` argument was added.

Example::

    client = pkg.Client()
    client.sync(timeout=5)

Remote
------

- Set ``remote.url`` first.
- Then run |project| sync.

.. code-block:: python
   :linenos:

   import pkg
   pkg.module.func()

.. |project| replace:: Sync
.. [1] A footnote.
.. a comment, not text
"""

ASCIIDOC = """\
git-fetch(1)
============

NAME
----
git-fetch - Download objects and refs from another repository

SYNOPSIS
--------
[verse]
'git fetch' [<options>] [<repository> [<refspec>...]]

DESCRIPTION
-----------
Fetch branches from one or more other repositories (see linkgit:git-remote[1]).
The `remote.<name>.fetch` setting decides *which* refs.

[[options]]
OPTIONS
-------
--depth=<depth>::
	Limit fetching to the specified number of commits from the tip of
	each remote branch history.
+
----
$ git fetch --depth=1 origin
----

-q::
--quiet::
	Pass --quiet to git-fetch-pack.

include::fetch-options.txt[]

// a comment line
Anything else is read as a refspec, see <<options,the options>>.
"""

MODERN_ASCIIDOC = """\
= Operations Runbook
:toc: left
:product: Sync

== Configuration

Set `core.autocrlf` for {product} clients.

=== Remote

NOTE: https://example.com/remote[The remote guide] explains this.

[source,bash]
----
git config remote.origin.url git@example.com:repo.git
----
"""

MARKDOWN = """\
---
layout: page
---
# Setup *Guide*

Intro with a [link](https://example.com), `a code span` and <b>inline html</b>.

## Configuration

Set `core.autocrlf` to **true**:

```bash
git config core.autocrlf true
```

### Remote

| Key | Meaning |
|-----|---------|
| `remote.url` | where to fetch |
"""

HTML = """\
<!DOCTYPE html><html><head><title>Sync - Site</title><style>p { color: red }</style>
<script>var secret = 1;</script></head><body><nav><a href="/">Home</a></nav>
<h1>Sync &amp; Share</h1><p>Intro <b>bold</b> text about <code>pkg.module.func()</code>.</p>
<h2>Configuration</h2><p>Use the <a href="#d">--depth</a> option.</p>
<pre><code>git clone --depth 1 url
cd repo</code></pre>
<h3>Remote</h3><ul><li>first item</li><li>second item</li></ul>
</body></html>
"""

MARKUP = re.compile(r"``|:func:|:class:|`_|\.\. |::$|^=+$|^-{4,}$|\[\[|linkgit:|include::|\*\*|</?(b|code|p|a|h\d|li|ul|pre|div|span)\b[^>]*>|^#+ |\|---", re.M)


def _read(tmp_path: Path, name: str, text: str):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_text(text)
    docs, errors = read_source(src / name, 1 << 20)
    assert not errors and len(docs) == 1
    doc = docs[0]
    return doc, chunk_document(doc)


def _section_texts(doc) -> dict[str | None, str]:
    return {s.heading: s.text for s in doc.sections}


def _no_markup(doc, chunks) -> None:
    for text in [s.text for s in doc.sections] + [c.text for c in chunks]:
        assert not MARKUP.search(text), MARKUP.search(text)


def test_restructuredtext(tmp_path):
    doc, chunks = _read(tmp_path, "guide.rst", REST)
    assert doc.title == "Sync Guide" and doc.kind == "rst"
    text = _section_texts(doc)
    assert list(text) == ["Configuration", "Configuration > Remote"]
    config = text["Configuration"]
    assert "Call pkg.module.func with retries=3 before Client." in config
    assert "See the docs and the glossary." in config
    assert "Note: The first call blocks until ready." in config
    assert "Changed in version 2.1: The timeout argument was added." in config
    assert "Example:\nclient = pkg.Client()\nclient.sync(timeout=5)" in config  # a literal block keeps its lines
    remote = text["Configuration > Remote"]
    assert "Set remote.url first.\nThen run Sync sync." in remote
    assert "import pkg\npkg.module.func()" in remote
    assert "install" not in config and "comment" not in remote and "maxdepth" not in config
    _no_markup(doc, chunks)
    assert {c.section for c in chunks} <= {"Configuration", "Configuration > Remote"}


def test_asciidoc_in_a_txt_file(tmp_path):
    doc, chunks = _read(tmp_path, "git-fetch.txt", ASCIIDOC)
    assert doc.title == "git-fetch(1)" and doc.kind == "adoc"
    text = _section_texts(doc)
    assert list(text) == ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS > --depth=<depth>", "OPTIONS > -q, --quiet",
                          "OPTIONS"]
    assert "git fetch [<options>] [<repository> [<refspec>...]]" in text["SYNOPSIS"]
    assert ("Fetch branches from one or more other repositories (see git-remote(1)). "
            "The remote.<name>.fetch setting decides which refs.") in text["DESCRIPTION"]
    depth = text["OPTIONS > --depth=<depth>"]
    assert depth.startswith("OPTIONS\n--depth=<depth>\nLimit fetching to the specified number of commits from the "
                            "tip of each remote branch history.")
    assert "$ git fetch --depth=1 origin" in depth
    assert text["OPTIONS"] == "Anything else is read as a refspec, see the options."
    _no_markup(doc, chunks)
    assert "comment" not in doc.text and "fetch-options" not in doc.text


def test_asciidoc_modern_syntax(tmp_path):
    doc, chunks = _read(tmp_path, "runbook.adoc", MODERN_ASCIIDOC)
    assert doc.title == "Operations Runbook"
    text = _section_texts(doc)
    assert list(text) == ["Configuration", "Configuration > Remote"]
    assert "Set core.autocrlf for Sync clients." in text["Configuration"]  # attribute references resolved
    assert "NOTE: The remote guide explains this." in text["Configuration > Remote"]
    assert "git config remote.origin.url git@example.com:repo.git" in text["Configuration > Remote"]
    assert ":toc:" not in doc.text
    _no_markup(doc, chunks)


def test_markdown(tmp_path):
    doc, chunks = _read(tmp_path, "setup.md", MARKDOWN)
    assert doc.title == "Setup Guide" and doc.kind == "md"
    text = _section_texts(doc)
    assert list(text) == ["Setup Guide", "Configuration", "Configuration > Remote"]
    assert "Intro with a link, a code span and inline html." in text["Setup Guide"]
    assert "Set core.autocrlf to true:\ngit config core.autocrlf true" in text["Configuration"]
    assert "remote.url | where to fetch" in text["Configuration > Remote"]
    assert "layout" not in doc.text
    _no_markup(doc, chunks)


def test_html(tmp_path):
    doc, chunks = _read(tmp_path, "page.html", HTML)
    assert doc.title == "Sync & Share" and doc.kind == "html"
    text = _section_texts(doc)
    assert list(text) == ["Sync & Share", "Configuration", "Configuration > Remote"]
    assert "Intro bold text about pkg.module.func()." in text["Sync & Share"]
    assert "Use the --depth option.\ngit clone --depth 1 url\ncd repo" in text["Configuration"]
    assert "first item\nsecond item" in text["Configuration > Remote"]
    assert "secret" not in doc.text and "color" not in doc.text and "Home" not in doc.text
    _no_markup(doc, chunks)


def test_an_html_page_without_one_top_heading_takes_its_title_element(tmp_path):
    """Generated manuals number their top-level sections ("1. Overview", "2. Syntax"): the first of them is not
    the page's name."""
    doc, _ = _read(tmp_path, "lang_upsert.html", "<html><head><title>UPSERT</title></head><body>"
                   "<h1>1. Overview</h1><p>UPSERT is a clause added to INSERT.</p>"
                   "<h1>2. Syntax</h1><p>ON CONFLICT DO UPDATE SET x = 1.</p></body></html>")
    assert doc.title == "UPSERT"
    assert list(_section_texts(doc)) == ["1. Overview", "2. Syntax"]


def test_an_html_page_is_read_without_its_site_menus_and_table_of_contents(tmp_path):
    page = ("<html><head><title>WAL</title></head><body><div class='menu mainmenu'><ul><li>Home<li>Download</ul></div>"
            "<div class=fancy_toc>Table Of Contents 1. Overview 2. How WAL Works</div>"
            "<div role=navigation><a href=a.html>previous</a></div><h1>Write-Ahead Logging</h1>"
            "<div class=note><p>A checkpoint moves pages back into the database.</p></div></body></html>")
    doc, _ = _read(tmp_path, "wal.html", page)
    assert doc.title == "Write-Ahead Logging" and "checkpoint moves pages" in doc.text
    assert not any(w in doc.text for w in ("Home", "Download", "Table Of Contents", "previous"))
    unclosed, _ = _read(tmp_path, "all.html", "<html><body><div class=menu><h1>Guide</h1><p>Set the port.</p>")
    assert unclosed.title == "Guide" and "Set the port." in unclosed.text  # never closed: read whole


def test_untitled_documents_take_a_pretty_file_name(tmp_path):
    doc, _ = _read(tmp_path, "index.rst.txt", "Just a paragraph with :func:`os.path.join` in it.\n\n.. note:: Read it.\n")
    assert doc.title == "Index" and doc.kind == "rst"
    assert doc.text == "Just a paragraph with os.path.join in it.\nNote: Read it."
    plain, _ = _read(tmp_path, "field_notes.txt", "Met Ada Fenwick at the observatory.\nIt rained.")
    assert plain.title == "Field Notes" and plain.kind == "txt"
    assert plain.text == "Met Ada Fenwick at the observatory.\nIt rained."


def test_chunks_never_cross_a_top_level_section_and_cut_between_subsections(tmp_path):
    options = "\n".join(f"--option-{i}::\n\tThe option number {i} changes how the command behaves in case {i}.\n"
                        for i in range(40))
    text = f"tool(1)\n=======\n\nNAME\n----\ntool - does things\n\nOPTIONS\n-------\n{options}\nSEE ALSO\n--------\nother(1)\n"
    doc, chunks = _read(tmp_path, "tool.txt", text)
    assert chunks[0].section == "NAME" and "tool - does things" in chunks[0].text
    options_chunks = [c for c in chunks if c.section.startswith("OPTIONS")]
    assert len(options_chunks) > 2 and all(c.n_tokens <= 256 for c in chunks)
    for c in options_chunks:  # cut between options: every chunk starts at one, none ends inside one
        assert c.text.split("\n")[0].startswith(("OPTIONS", "--option-"))
        assert c.text.rstrip().endswith(".")
    assert chunks[-1].section == "SEE ALSO" and chunks[-1].text == "SEE ALSO\nother(1)"
    assert all("\n" in c.text for c in chunks)  # headings and items keep their own lines


@pytest.mark.skipif(not GITDOCS.exists(), reason="the gitdocs set is not on this machine")
def test_git_documentation_reads_well():
    docs, errors = read_source(GITDOCS, 1 << 24)
    assert not errors and len(docs) == 292
    by_source = {d.source: d for d in docs}
    clone = by_source["git-clone.txt"]
    assert clone.title == "git-clone(1)" and clone.kind == "adoc"
    headings = [s.heading for s in clone.sections]
    assert headings[:3] == ["NAME", "SYNOPSIS", "DESCRIPTION"] and "OPTIONS > --depth <depth>" in headings
    assert "linkgit:" not in clone.text and "git-maintenance(1)" in clone.text
    assert sum(d.kind == "adoc" for d in docs) >= 280
    assert not [d.title for d in docs if d.title.endswith((".txt", ".Txt"))]
