"""Text as the models read and write it: vocabularies, subword tokenizers, decoding.

Owned here, below the tasks and the exported models that both use them:

    vocab      characters <-> ids (`Vocab`, `TokenVocab`) and the special tokens
    subwords   BPE or unigram pieces trained with Hugging Face `tokenizers` (`SubwordVocab`)
    decoding   greedy decoding of ids into text (`translate_ids`)

It imports nothing else of `nas`.
"""
