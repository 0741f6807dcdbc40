"""Questions and corpora: the embedded synthetic world (`world*`), real question/passage files
read as a world (`real`), the corpus file (`corpus`), importers of FlashRAG-style files
(`importers`, `flashrag`, `outputs`), gold-document readers (`gold`) and the data sets fetched
from the hub (`fetch`, `download`, `manifest`, `shared`).

May import core/ and util/.
"""
