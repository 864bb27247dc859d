# smoke: (being written)
