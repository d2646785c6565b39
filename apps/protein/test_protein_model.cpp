// placeholder: written on the protein branch
