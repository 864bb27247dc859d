#!/bin/sh
# Installs the TeX the paper needs (latexmk, pdflatex, BibTeX; booktabs, natbib, hyperref, microtype,
# geometry, amsmath) and pdftoppm, from Debian's packages: about 50 MB of downloads. Idempotent: exits
# at once when everything is there. Needs root and apt-get (tests/test_paper_pdf.py runs it then).
set -eu
PACKAGES="latexmk texlive-latex-base texlive-latex-recommended poppler-utils"
if command -v latexmk >/dev/null && command -v pdflatex >/dev/null && command -v bibtex >/dev/null \
    && command -v pdftoppm >/dev/null && kpsewhich booktabs.sty natbib.sty microtype.sty >/dev/null; then
    echo "TeX already installed"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "needs root and apt-get to install: $PACKAGES" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -q
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $PACKAGES
