# comm: (being written)
