# sitecheck: (being written)
