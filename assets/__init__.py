"""Software-defined assets, one module per stage, named for what each produces."""
