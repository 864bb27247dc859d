# system: (being written)
