"""mkdocs hooks: the site's home page is the repository's README.md (one text, two readers).

The README links its pages as ``docs/PAGE.md``; on the site, where the pages are the root, those links lose the
``docs/`` prefix. Nothing else is rewritten.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    readme = Path(config["config_file_path"]).parent / "README.md"
    text = readme.read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_page_markdown(markdown, page, config, files):
    """A page's link to the README (``../README.md``, from docs/ on GitHub) is the home page on the site."""
    depth = page.file.src_uri.count("/")
    return markdown.replace("](" + "../" * (depth + 1) + "README.md", "](" + "../" * depth + "index.md")
