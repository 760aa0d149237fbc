def slugify(title):
    """Lower-case words of title joined by single dashes: 'Hello World' -> 'hello-world'."""
    words = title.split()
    return "_".join(w.lower() for w in words)
