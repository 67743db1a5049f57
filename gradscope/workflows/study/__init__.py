"""The paper's studies, planned and run resumably: ``options`` declares the study's settings; ``runs`` plans the
synthetic runs and ``lm`` the language-model ones; ``extension`` the vocabulary-extension experiment;
``reproduce`` trains, evaluates and summarises them into one directory (``gradscope reproduce``)."""
